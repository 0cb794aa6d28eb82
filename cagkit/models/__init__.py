"""The models cagkit runs: names and weights (`registry`), loading (`loading`), devices (`device`), the
architecture facts read from a model's config (`architecture`) and the fingerprint that identifies a model
(`identity`)."""

from cagkit.models.loading import LoadedModel, fingerprint, load_model, register_loaded
from cagkit.models.registry import KNOWN_MODELS, cagkit_home, convert, converted_dir, describe_models, resolve

__all__ = ["KNOWN_MODELS", "LoadedModel", "cagkit_home", "convert", "converted_dir", "describe_models", "fingerprint",
           "load_model", "register_loaded", "resolve"]
