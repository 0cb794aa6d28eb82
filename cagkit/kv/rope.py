"""Rotary position embeddings: remove them from stored keys, re-apply them where a chunk is placed.

Keys are stored without RoPE so a chunk can sit at any position. Each model's own rotary module computes the
angles (so RoPE scaling variants and Gemma 3's per-layer-type bases come from its config, not from here).
"""

from __future__ import annotations

import inspect

import torch

from cagkit.models.architecture import decoder_stack, layer_types


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryTables:
    """cos/sin tables of one model per layer, for any positions: `cos, sin = tables(layer, positions)`."""

    def __init__(self, model):
        base = decoder_stack(model)
        self.rotary = base.rotary_emb
        self.config = model.config.get_text_config()
        self.types = layer_types(self.config)
        self._by_type = "layer_type" in inspect.signature(self.rotary.forward).parameters

    def kind(self, layer: int):
        """What sets `layer`'s angles: its layer type where the rotary module has one per type, else None (one
        table for every layer), so a caller can compute the tables once per kind."""
        return self.types[layer] if self._by_type else None

    @torch.no_grad()
    def __call__(self, layer: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] long -> cos, sin: [T, D] float32, on the model's device
        buffer = next(self.rotary.buffers(), None)  # the inverse frequencies, on the model's device
        device = buffer.device if buffer is not None else positions.device
        probe = torch.zeros(1, dtype=torch.float32, device=device)
        pos = positions.reshape(1, -1).to(device)
        if self._by_type:
            cos, sin = self.rotary(probe, pos, self.types[layer])
        else:
            cos, sin = self.rotary(probe, pos)
        return cos[0].float(), sin[0].float()


def apply_rope(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate RoPE-free keys to their positions. keys: [T, H, D]; cos, sin: [T, D]."""
    c, s = cos[:, None, :], sin[:, None, :]
    return keys * c + _rotate_half(keys) * s


def remove_rope(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Undo `apply_rope` exactly. keys: [T, H, D] rotated; cos, sin: [T, D] as used to rotate them.

    Dividing by cos² + sin² also undoes any attention scaling that a RoPE variant folds into cos and sin.
    """
    c, s = cos[:, None, :], sin[:, None, :]
    return (keys * c - _rotate_half(keys) * s) / (c * c + s * s)
