"""The pure parts of the long-context benchmark (benchmarks/ttft.py): which chunks make a context of a given size,
the target's token stream over them, where the scored continuations start, and the summary that joins time to
first token with quality."""

from __future__ import annotations


def context_chunk_count(chunk_tokens: list[int], size: int) -> int:
    """How many leading chunks the context of `size` source tokens takes: chunks in order until they hold `size`."""
    total = 0
    for i, n in enumerate(chunk_tokens):
        if total >= size:
            return i
        total += n
    return len(chunk_tokens)


def join_chunks(chunk_ids: list[list[int]], sep: list[int]) -> tuple[list[int], list[int]]:
    """The token stream of chunks joined by `sep`, and where each chunk starts in it."""
    ids: list[int] = []
    starts = []
    for i, chunk in enumerate(chunk_ids):
        if i:
            ids += sep
        starts.append(len(ids))
        ids += chunk
    return ids, starts


def truncated_lengths(starts: list[int], lengths: list[int], cut: int) -> list[int]:
    """How many tokens of each chunk lie before stream position `cut`."""
    return [max(0, min(n, cut - s)) for s, n in zip(starts, lengths)]


def continuation_points(context_end: int, span: int, count: int) -> list[int]:
    """Stream positions where the scored continuations start: the end of the context, then `span`, `2 * span`, ...
    tokens earlier (latest first), none before position 1."""
    return [p for p in (context_end - j * span for j in range(count)) if p >= 1]


def recovery(nll_none: float, nll_method: float, nll_native: float) -> float | None:
    """The share of the no-context -> native NLL gap that the method closes (None when there is no gap)."""
    gap = nll_none - nll_native
    return (nll_none - nll_method) / gap if abs(gap) > 1e-9 else None


def summary_rows(result: dict) -> list[dict]:
    """One row per target and size joining the TTFT rows (native and cagkit) with the quality entry."""
    ttft = {}
    for r in result["rows"]:
        if "error" not in r:
            key = (r["target"], r.get("size", r["context_tokens"]), "native" if r["mode"] == "native" else "cagkit")
            ttft[key] = r
    quality = {(q["target"], q["size"]): q for q in result.get("quality", []) if "error" not in q}
    out = []
    for (target, size, kind), r in ttft.items():
        if kind != "native":
            continue
        c = ttft.get((target, size, "cagkit"))
        q = quality.get((target, size))
        out.append({"target": target, "size": size, "native": r, "cagkit": c, "quality": q})
    return out
