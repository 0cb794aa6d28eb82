"""Attention over placed KV in the flash-attention layout `[B, T, H, D]`, and the plain reference it must match.

cagkit keeps and translates KV as `[T, H, D]` per layer (stacked `[L, T, H, D]`), the layout flash-attn reads
without a transpose. `attention` runs flash-attn on a CUDA tensor when the optional `flash-attn` package is
installed (`pip install 'cagkit[gpu]'`) and PyTorch's scaled-dot-product attention otherwise;
`reference_attention` is the textbook computation both are tested against. `layer_kv` gives one layer of placed
chunks in this layout, RoPE applied: the same keys and values `cagkit.kv.place.place_chunks` writes into
transformers' `[B, H, T, D]` cache. Either flash-attn generation serves: FlashAttention-2 (`pip install
'cagkit[gpu]'`) or FlashAttention-4 (`pip install flash-attn-4`, Hopper and Blackwell GPUs only).

Query positions are the last `Tq` of the `Tk` key positions (a question after its context), so the causal mask
is aligned bottom-right, as flash-attn aligns it.

The repair (`cagkit.kv.repair`) attends through `attention`: its recomputed tokens come in runs of consecutive
positions (whole sentences), and each run attends to every key up to its own end (`QueryRuns`, `attend_runs`).
`route_query_runs` puts this in transformers' way: the model's attention function answers a forward that carries
a `QueryRuns` (keyword `cagkit_query_runs`) through `attend_runs`, and every other forward as before.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

from cagkit.kv.chunk import ChunkKV
from cagkit.kv.rope import RotaryTables, apply_rope


@lru_cache(maxsize=1)
def _flash_attn() -> tuple[Callable, int] | None:
    """flash-attn's `flash_attn_func` and its generation: FlashAttention-2 (`flash_attn`, the `cagkit[gpu]` extra)
    or, failing that, FlashAttention-4 (`flash_attn.cute`, package `flash-attn-4`, for Hopper and Blackwell GPUs);
    None when neither imports."""
    try:
        from flash_attn import flash_attn_func

        return flash_attn_func, 2
    except (ImportError, OSError):
        pass
    try:
        from flash_attn.cute import flash_attn_func

        return flash_attn_func, 4
    except (ImportError, OSError):
        return None


def flash_attn_available(device: torch.device | str | None = None) -> bool:
    """Whether flash-attn can run here: the package is installed and the device (default: any) is CUDA."""
    if importlib.util.find_spec("flash_attn") is None or not torch.cuda.is_available():
        return False
    if device is not None and torch.device(device).type != "cuda":
        return False
    return _flash_attn() is not None


def flash_attn_version() -> int | None:
    """2 or 4: which flash-attn `attention` uses on CUDA; None without one."""
    found = _flash_attn() if flash_attn_available() else None
    return found[1] if found else None


def _mask(tq: int, tk: int, causal: bool, window: int | None, device) -> torch.Tensor | None:
    """[Tq, Tk] True where query i may attend to key j; queries sit at key positions tk-tq .. tk-1."""
    if not causal and window is None:
        return None
    qpos = torch.arange(tk - tq, tk, device=device)[:, None]
    kpos = torch.arange(tk, device=device)[None, :]
    allowed = torch.ones(tq, tk, dtype=torch.bool, device=device)
    if causal:
        allowed &= kpos <= qpos
    if window is not None:
        allowed &= kpos > qpos - window
    return allowed


def _check_groups(heads: int, kv_heads: int) -> None:
    """Grouped-query attention: each KV head serves heads // kv_heads query heads, so the split must be even."""
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} KV heads evenly")


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, Hk, D] -> [B, T, heads, D]: each KV head serves heads // Hk query heads (grouped-query attention)."""
    _check_groups(heads, x.shape[2])
    return x.repeat_interleave(heads // x.shape[2], dim=2)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                        window: int | None = None, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v in float64, written out plainly. q: [B, Tq, Hq, D]; k, v: [B, Tk, Hk, D]
    -> [B, Tq, Hq, D]. `window`: each query sees only the last `window` keys up to itself (sliding attention)."""
    heads = q.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qd, kd, vd = q.double(), _repeat_kv(k, heads).double(), _repeat_kv(v, heads).double()
    scores = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * scale
    allowed = _mask(q.shape[1], k.shape[1], causal, window, q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", weights, vd).to(q.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, window: int | None = None,
              scale: float | None = None, backend: str = "auto") -> torch.Tensor:
    """Attention in the flash layout. Shapes as `reference_attention`. `backend`: `flash` (flash-attn, CUDA
    tensors only), `sdpa` (PyTorch's scaled-dot-product attention, any device) or `auto` (flash-attn on CUDA
    when installed, else SDPA)."""
    if backend not in ("auto", "flash", "sdpa"):
        raise ValueError(f"unknown attention backend {backend!r}; use auto, flash or sdpa")
    use_flash = backend == "flash" or (backend == "auto" and q.is_cuda and flash_attn_available(q.device))
    if use_flash:
        if not (q.is_cuda and flash_attn_available(q.device)):
            raise RuntimeError("the flash backend needs CUDA tensors and flash-attn (pip install 'cagkit[gpu]')")
        func, version = _flash_attn()
        # flash-attn takes fp16/bf16, aligns the causal mask bottom-right and handles grouped-query heads itself.
        half = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        unlimited = (-1, -1) if version == 2 else (None, None)
        out = func(q.to(half), k.to(half), v.to(half), softmax_scale=scale, causal=causal,
                   window_size=(window - 1, 0) if window is not None else unlimited)
        if isinstance(out, tuple):  # FlashAttention-4 returns (out, log-sum-exp)
            out = out[0]
        return out.to(q.dtype)
    _check_groups(q.shape[2], k.shape[2])
    allowed = _mask(q.shape[1], k.shape[1], causal, window, q.device)
    # grouped-query heads shared inside SDPA: no copy of the keys and values per query head (the repair calls
    # this once per run of recomputed tokens, per layer, so the copies added up)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed, scale=scale,
        enable_gqa=k.shape[2] != q.shape[2],
    )
    return out.transpose(1, 2)


def layer_kv(chunks: list[ChunkKV], layer: int, tables: RotaryTables, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer of `chunks` placed from position `start`, RoPE applied, in the flash layout: ([1, N, H, D] x 2)."""
    keys = torch.cat([c.keys[layer] for c in chunks]).float()  # [N, H, D]
    values = torch.cat([c.values[layer] for c in chunks]).float()
    cos, sin = tables(layer, torch.arange(start, start + keys.shape[0]))  # on the model's device
    return apply_rope(keys.to(cos.device), cos, sin)[None], values.to(cos.device)[None]


@dataclass(frozen=True)
class QueryRuns:
    """Queries in runs of consecutive positions over keys that a cache holds out of position order.

    order: [K] for each absolute position 0..K-1, the index of its key in the cache. runs: (first, end, key_end)
    per run: queries first..end-1 sit at positions key_end - (end - first) .. key_end - 1 and attend causally to
    the keys of positions 0 .. key_end - 1. The runs cover the queries in order.
    """

    order: torch.Tensor
    runs: tuple[tuple[int, int, int], ...]

    @classmethod
    def of(cls, key_positions: torch.Tensor, query_positions: torch.Tensor) -> QueryRuns:
        """From the absolute position of each cache entry (`key_positions` [K], a permutation of 0..K-1, the
        queries' own new entries included) and of each query (`query_positions` [Q])."""
        order = torch.argsort(key_positions)
        if not torch.equal(key_positions[order].cpu(), torch.arange(len(key_positions))):
            raise ValueError("the cache must hold each position 0..K-1 exactly once")
        positions = query_positions.tolist()
        runs, first = [], 0
        for i in range(1, len(positions) + 1):
            if i == len(positions) or positions[i] != positions[i - 1] + 1:
                runs.append((first, i, positions[i - 1] + 1))
                first = i
        return cls(order, tuple(runs))


def attend_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: QueryRuns, window: int | None = None,
                scale: float | None = None, backend: str = "auto") -> torch.Tensor:
    """Each run of `plan` through `attention` over the keys up to its end, causal and bottom-right aligned.
    q: [B, Q, Hq, D]; k, v: [B, K, Hk, D] in cache order -> [B, Q, Hq, D]."""
    end = max(run[2] for run in plan.runs)
    index = plan.order[:end].to(k.device)
    k, v = k.index_select(1, index), v.index_select(1, index)  # position order: key j is position j
    return torch.cat([attention(q[:, a:b], k[:, :e], v[:, :e], True, window, scale, backend)
                      for a, b, e in plan.runs], dim=1)


RUNS_KEYWORD = "cagkit_query_runs"
ROUTABLE = ("sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4")
_ROUTED: dict[str, Callable] = {}
_ROUTING = threading.Lock()


def route_query_runs(implementation: str) -> None:
    """Make transformers' attention function `implementation` (one of `ROUTABLE`) send a forward that carries a
    `QueryRuns` as keyword `cagkit_query_runs` through `attend_runs` (flash-attn on CUDA where installed, SDPA
    otherwise); every other forward reaches the function unchanged. Idempotent. The forward that carries the
    runs passes a 4D placeholder as its attention mask, which transformers hands on as given instead of
    building a mask the runs do not need."""
    if implementation not in ROUTABLE:
        raise ValueError(f"cannot route attention implementation {implementation!r}; one of {', '.join(ROUTABLE)}")
    with _ROUTING:
        if implementation in _ROUTED:
            return
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        original = ALL_ATTENTION_FUNCTIONS[implementation]

        def routed(module, query, key, value, attention_mask, *args, **kwargs):
            plan = kwargs.pop(RUNS_KEYWORD, None)
            if plan is None:
                return original(module, query, key, value, attention_mask, *args, **kwargs)
            return _runs_forward(query, key, value, plan, **kwargs)

        AttentionInterface.register(implementation, routed)
        _ROUTED[implementation] = original


def _runs_forward(query, key, value, plan: QueryRuns, dropout: float = 0.0, scaling: float | None = None,
                  sliding_window: int | None = None, softcap: float | None = None, **kwargs):
    """transformers' attention-function contract ([B, H, T, D] in, ([B, Q, H, D], None) out) over `attend_runs`."""
    if softcap is not None or kwargs.get("s_aux") is not None:
        raise NotImplementedError("query runs do not support attention logit soft-capping or attention sinks")
    q = query.transpose(1, 2).contiguous()
    out = attend_runs(q, key.transpose(1, 2), value.transpose(1, 2), plan, sliding_window, scaling)
    return out, None
