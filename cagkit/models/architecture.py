"""Facts about a model's architecture, read from its config (never guessed from its name): which layers
attend over a sliding window, how wide it is, and where the decoder stack sits.
"""

from __future__ import annotations


def layer_types(config) -> list[str]:
    """Per layer, 'full_attention' or 'sliding_attention' (every layer full when the config says nothing)."""
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * config.num_hidden_layers


def sliding_window(config, layer: int) -> int | None:
    """The window of a sliding-attention layer, None for a full-attention one."""
    if layer_types(config)[layer] == "sliding_attention":
        return config.sliding_window
    return None


def context_length(config) -> int | None:
    """The most positions the model reads (prompt and answer together), None when its config does not say."""
    return getattr(config, "max_position_embeddings", None)


def decoder_stack(model):
    """The model's decoder (embeddings, layers, rotary module) without the LM head."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model
