"""Align two tokenizations of the same text by character spans.

A translator reads source-model features at target-model tokens. Both tokenizers report, per token, the
character span `[start, end)` it covers in the text (`return_offsets_mapping=True`); a target token gathers the
source tokens whose spans overlap its own. Two ways to weigh them:

- `cover`: the one source token covering the target token's last character (a one-hot row). The source token
  that ends a word carries, in a causal model, everything about that word; this is the default (each
  translator card records the mode it was trained with).
- `overlap`: every overlapping source token, weighted by how many characters it shares with the target token.

Real tokenizers produce awkward spans, all handled here: byte-fallback pieces of one multi-byte character share
the same one-character span (the last such piece is taken as covering it); a token may have an empty span
(special or zero-width pieces), which is read as covering the character just before it; whitespace that no
source token reports (trimmed offsets) is covered by the nearest source token that starts before it.
"""

from __future__ import annotations

import torch

from cagkit.config import ALIGN_MODES as MODES


def _covering(source_offsets: torch.Tensor, chars: torch.Tensor) -> torch.Tensor:
    """Index of the source token covering each character position: the last one that starts at or before it."""
    # source_offsets: [Ts, 2]; chars: [Tt] -> [Tt] long
    # Empty source spans cover nothing: search only the others, then map back to full indices.
    kept = (source_offsets[:, 1] > source_offsets[:, 0]).nonzero().squeeze(1)
    if kept.numel() == 0:
        kept = torch.arange(source_offsets.shape[0])
    starts = torch.cummax(source_offsets[kept, 0], dim=0).values  # searchsorted needs it non-decreasing
    # `right=True` takes the last of several tokens that start at the same char (byte-fallback pieces)
    found = torch.searchsorted(starts.contiguous(), chars.contiguous(), right=True) - 1
    return kept[found.clamp(min=0)]


def align(source_offsets: torch.Tensor, target_offsets: torch.Tensor, mode: str = "cover") -> torch.Tensor:
    """Weights with which each target token gathers source tokens: `aligned = weights @ source_features`.

    source_offsets: [Ts, 2] and target_offsets: [Tt, 2], char spans `[start, end)` into the same text.
    Returns weights [Tt, Ts] float32, each row summing to 1.
    """
    if mode not in MODES:
        raise ValueError(f"alignment mode must be one of {MODES}, not {mode!r}")
    source_offsets = torch.as_tensor(source_offsets, dtype=torch.long).reshape(-1, 2)
    target_offsets = torch.as_tensor(target_offsets, dtype=torch.long).reshape(-1, 2)
    num_target, num_source = target_offsets.shape[0], source_offsets.shape[0]
    if num_source == 0:
        raise ValueError("cannot align to an empty source tokenization")
    start, end = target_offsets[:, 0], target_offsets[:, 1]
    last_char = torch.where(end > start, end - 1, start - 1).clamp(min=0)  # [Tt]
    weights = torch.zeros(num_target, num_source)
    weights[torch.arange(num_target), _covering(source_offsets, last_char)] = 1.0
    if mode == "overlap":
        # shared characters of every (target, source) pair: [Tt, Ts]
        lo = torch.maximum(start[:, None], source_offsets[None, :, 0])
        hi = torch.minimum(end[:, None], source_offsets[None, :, 1])
        shared = (hi - lo).clamp(min=0).float()
        total = shared.sum(dim=1, keepdim=True)
        # rows with no shared character (empty span, untokenized gap) keep the covering token
        weights = torch.where(total > 0, shared / total.clamp(min=1), weights)
    return weights
