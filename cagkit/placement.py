"""Ask-time options that trade speed for quality when stored chunks become a target's context.

Kept apart from `cagkit.ask` so that code reading results files (the report) can use it without loading torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from cagkit.errors import CagkitError

BLEND_SELECT = ("deviation", "question")


@dataclass(frozen=True)
class Placement:
    """How stored or translated chunks become the target's context: the ask-time trade of speed for quality.

    recompute_layers: translated modes only: the target recomputes its bottom this many layers over each chunk
        alone (about this share of a native prefill) and only the layers above are translated.
    blend: the share of context tokens the target recomputes through every layer with attention over all the
        retrieved chunks (`cagkit.blend`), after prefilling its bottom two layers over them jointly; it restores
        the cross-chunk attention that chunks stored one at a time never had. 0 = off, 1 = a joint prefill.
    blend_select: which tokens `blend` recomputes: `deviation` (those whose layer-1 KV differs most from the
        joint prefill, as CacheBlend) or `question` (whole sentences, most similar to the question first).
    """

    recompute_layers: int = 0
    blend: float = 0.0
    blend_select: str = "deviation"

    def check(self, lm) -> None:
        """Refuse options out of range for `lm` (a `cagkit.models.LoadedModel`)."""
        if not 0 <= self.recompute_layers <= lm.num_layers:
            raise CagkitError(f"--recompute-layers must be between 0 and {lm.num_layers} for {lm.name}, "
                              f"got {self.recompute_layers}")
        if not 0.0 <= self.blend <= 1.0:
            raise CagkitError(f"--blend must be a share of the context tokens between 0 and 1, got {self.blend}")
        if self.blend_select not in BLEND_SELECT:
            raise CagkitError(f"--blend-select must be one of {', '.join(BLEND_SELECT)}, got '{self.blend_select}'")

    def settings(self) -> dict:
        """The options that differ from the defaults, for a results file."""
        return {k: v for k, v in asdict(self).items() if v != getattr(Placement(), k)}

    def describe(self) -> str:
        """The options that differ from the defaults, for a label: '' or e.g. ', blend 0.5'."""
        return "".join(f", {k.replace('_', ' ')} {v}" for k, v in self.settings().items())

    def cli_args(self) -> list[str]:
        """The `cagkit ask` / `cagkit eval` options that reproduce this placement."""
        return [arg for k, v in self.settings().items() for arg in (f"--{k.replace('_', '-')}", str(v))]

    @classmethod
    def from_settings(cls, settings: dict) -> "Placement":
        """The placement recorded in a results file's settings (absent options are the defaults)."""
        return cls(**{f.name: settings[f.name] for f in fields(cls) if f.name in settings})
