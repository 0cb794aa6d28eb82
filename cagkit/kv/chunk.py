"""A chunk's KV as cagkit keeps it: RoPE-free, in the flash-attention layout, per layer `[T, H, D]`, stacked
over layers as `[L, T, H, D]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ChunkKV:
    """The RoPE-free KV of one chunk. keys, values: [L, T, H, D]."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[1]
