"""Compressed KV for the store: int8 and int4, keys quantized per channel and values per token (KIVI).

A chunk's keys and values are [L, T, H, D]. Pre-RoPE keys have a few channels of large magnitude that stay large
across tokens, so keys are quantized per channel: each (layer, head, channel) gets its own scale and minimum over a
group of `KEY_GROUP` consecutive tokens. Values have no such channels, and each output mixes them per token, so
values are quantized per token: each (layer, token, head) gets a scale and minimum over a group of `VALUE_GROUP`
channels. Both are asymmetric min-max with round-to-nearest; the scales and minimums are float16 and live in the
same safetensors file as the codes, under the chunk's own names, so the chunk's checksum covers them:

    {i}.keys          uint8 [L, T, H, D] codes (int4: [L, T, H, D/2], two codes a byte, low nibble first)
    {i}.keys.scale    float16 [L, ceil(T/KEY_GROUP), H, D]
    {i}.keys.min      float16, as keys.scale
    {i}.values        uint8, as keys
    {i}.values.scale  float16 [L, T, H, D/VALUE_GROUP]
    {i}.values.min    float16, as values.scale
    {i}.quant         int32 [bits, key group, value group, key width, value width]

int4 refines the keys of the `REFINED_KEY_LAYERS` layers whose int4 keys err most relative to their norm, chunk by
chunk (where int4 changes the answers most; benchmarks/int4_keys.py): each of their keys gets a second 4-bit code
for what the first left, in sixteen levels across the first code's step, so those layers' keys are read at about
int8's precision while their int4 codes stay as they are (a reader that does not know the refinement reads plain
int4):

    {i}.keys.fine         uint8 [R, T, H, D/2] second codes of the refined layers, packed as keys
    {i}.keys.fine_layers  int32 [R] which layers, in that order

An odd head width is padded by one channel (a copy of the last) for int4's packing and cut back as it is read.

With groups of 64 a value costs bits/8 + 4/64 bytes: int8 0.53x and int4 0.28x of float16's 2 bytes, and int4's
refined keys add R/L of a half byte to every key (`bytes_per_value`: 0.29x for qwen's 24 layers).
`dequantize` gives float32, the dtype the target's cache takes on CPU, in one pass as the KV is placed.
"""

from __future__ import annotations

import math

from cagkit.config import KV_DTYPES

QUANT_BITS = {"int8": 8, "int4": 4}  # the store's compressed KV dtypes
KEY_GROUP = 64  # tokens per key scale (per channel)
VALUE_GROUP = 64  # channels per value scale (per token); a head of another width gets one scale per head
REFINED_KEY_LAYERS = 2  # int4: layers whose keys get a second code (the most in error)
FINE_LEVELS = 15  # the second code's steps across the first's


def bytes_per_value(dtype: str, layers: int) -> float:
    """The bytes a key or value takes, on average, in the store's `dtype` for a model of `layers` layers: a float
    dtype's own size; compressed, the codes and the float16 scale and minimum of each group of 64, and int4's
    refined layers' second key codes."""
    size = KV_DTYPES[dtype]  # codes, and the scale and minimum of each group
    if dtype == "int4":
        size += min(REFINED_KEY_LAYERS, layers) / layers * 0.5 / 2  # half a byte a key, none a value
    return size


def is_quantized(dtype: str) -> bool:
    return dtype in QUANT_BITS


def _value_group(head_dim: int) -> int:
    return VALUE_GROUP if head_dim % VALUE_GROUP == 0 else head_dim


def quantize(keys, values, dtype: str) -> dict:
    """The tensors that hold `keys` and `values` [L, T, H, D] in `dtype` (int8 or int4), named as in this module's
    docstring without the `{i}.` prefix."""
    import torch

    bits = QUANT_BITS[dtype]
    widths = [keys.shape[-1], values.shape[-1]]
    keys, values = _even(keys, bits), _even(values, bits)
    L, T, H, D = keys.shape
    groups = max(1, math.ceil(T / KEY_GROUP))
    k = keys.to(device="cpu", dtype=torch.float32)
    if groups * KEY_GROUP != T:  # pad with the last token, which moves no group's minimum or maximum
        k = torch.cat([k, k[:, -1:].expand(L, groups * KEY_GROUP - T, H, D)], dim=1) if T else k
    k = k.reshape(L, groups, KEY_GROUP, H, D) if T else k.reshape(L, 0, KEY_GROUP, H, D)
    grouped_codes, k_scale, k_min = _codes(k, dim=2, bits=bits)
    k_codes = grouped_codes.reshape(L, groups * KEY_GROUP, H, D)[:, :T]
    vd = values.shape[-1]
    vg = _value_group(vd)
    v = values.to(device="cpu", dtype=torch.float32).reshape(*values.shape[:-1], vd // vg, vg)
    v_codes, v_scale, v_min = _codes(v, dim=-1, bits=bits)
    v_codes = v_codes.reshape(values.shape)
    out = {"keys": _pack(k_codes, bits), "keys.scale": k_scale.squeeze(2), "keys.min": k_min.squeeze(2),
           "values": _pack(v_codes, bits), "values.scale": v_scale.squeeze(-1), "values.min": v_min.squeeze(-1),
           "quant": torch.tensor([bits, KEY_GROUP, vg, *widths], dtype=torch.int32)}
    if bits == 4 and T and REFINED_KEY_LAYERS:
        out.update(_refine(k, grouped_codes, k_scale, k_min, T))
    return out


def _refine(k, codes, scale, low, T: int) -> dict:
    """The second key codes of the layers whose int4 keys (`codes` [L, G, group, H, D] of the grouped keys `k`,
    decoding by `scale` and `low` [L, G, 1, H, D]) err most relative to their norm."""
    import torch

    step = scale.float()
    left = k - (codes.float() * step + low.float())  # within half a step of 0, but where float16 rounded
    layers = most_in_error(k.flatten(1, 2)[:, :T], left.flatten(1, 2)[:, :T], REFINED_KEY_LAYERS)  # no padding
    safe = torch.where(step > 0, step, torch.ones_like(step))[layers]
    fine = ((left[layers] / safe + 0.5) * FINE_LEVELS).round_().clamp_(0, FINE_LEVELS).to(torch.uint8)
    fine = fine.flatten(1, 2)[:, :T]
    return {"keys.fine": _pack(fine, 4), "keys.fine_layers": layers.to(torch.int32)}


def most_in_error(keys, error, n: int):
    """The `n` layers (sorted) of `keys` [L, ...] whose quantization `error` (as shaped) is largest relative to
    their keys' norm."""
    relative = error.flatten(1).norm(dim=1) / keys.flatten(1).norm(dim=1).clamp_min(1e-12)
    return relative.topk(min(n, keys.shape[0])).indices.sort().values


def dequantize(t: dict) -> tuple:
    """(keys, values) float32 [L, T, H, D] from a chunk's tensors as `quantize` names them: the codes widened
    once, then scaled and shifted in place through broadcast views (no scale is repeated per token)."""
    bits, key_group, value_group, *widths = (int(x) for x in t["quant"].tolist())
    key_width, value_width = widths or (None, None)  # files written before odd widths were padded name none
    keys = _unpack(t["keys"], bits).float()
    T = keys.shape[1]
    scale, low = t["keys.scale"].float().unsqueeze(2), t["keys.min"].float().unsqueeze(2)
    full = T // key_group
    if full:
        grouped = keys[:, :full * key_group].unflatten(1, (full, key_group))
        grouped.mul_(scale[:, :full]).add_(low[:, :full])
    if full * key_group < T:
        keys[:, full * key_group:].mul_(scale[:, full]).add_(low[:, full])
    if "keys.fine" in t:  # the refined layers' second codes: what the first left, in FINE_LEVELS steps of its step
        for fine, layer in zip(_unpack(t["keys.fine"], 4), t["keys.fine_layers"].tolist()):
            step = scale[layer].squeeze(1).repeat_interleave(key_group, 0)[:T]  # [T, H, D]
            keys[layer].add_(fine.float().div_(FINE_LEVELS).sub_(0.5).mul_(step))
    values = _unpack(t["values"], bits).float()
    grouped = values.unflatten(-1, (values.shape[-1] // value_group, value_group))
    grouped.mul_(t["values.scale"].float().unsqueeze(-1)).add_(t["values.min"].float().unsqueeze(-1))
    return keys[..., :key_width], values[..., :value_width]


def _even(x, bits: int):
    """`x` with its last dimension made even for int4's packing (the last channel repeated); as it is otherwise."""
    import torch

    if bits == 8 or x.shape[-1] % 2 == 0:
        return x
    return torch.cat([x, x[..., -1:]], dim=-1)


def _codes(x, dim: int, bits: int):
    """Round-to-nearest asymmetric codes of `x` over `dim`, with the float16 scale and minimum they decode by."""
    import torch

    levels = (1 << bits) - 1
    low = x.amin(dim=dim, keepdim=True).to(torch.float16)
    high = x.amax(dim=dim, keepdim=True)
    scale = ((high - low.float()) / levels).to(torch.float16)
    # a constant group (or one whose range float16 rounds to 0) decodes to its minimum
    safe = torch.where(scale.float() > 0, scale.float(), torch.ones_like(scale, dtype=torch.float32))
    codes = ((x - low.float()) / safe).round_().clamp_(0, levels).to(torch.uint8)
    return codes, scale, low


def _pack(codes, bits: int):
    if bits == 8:
        return codes.contiguous()
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def _unpack(packed, bits: int):
    import torch

    if bits == 8:
        return packed
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
