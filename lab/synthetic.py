"""Documents of random chunks for the store benchmarks (benchmarks/lance_race.py, s3_reads.py): what a writer
stores, without a model."""

from __future__ import annotations

import numpy as np
import torch

from cagkit.kv.chunk import ChunkKV
from cagkit.store.store import NewChunk, StoreSettings

DIM = 8  # embedding size of `settings`' fake embedder


def settings(fingerprint: str, chunk_tokens: int) -> StoreSettings:
    return StoreSettings(source="fake", source_fingerprint=fingerprint, dtype="float16", chunk_tokens=chunk_tokens,
                         embedder=f"fake-{DIM}")


def random_document(seed: int, chunks: int, tokens: int, kv_shape: tuple[int, int, int] = (2, 1, 4)
                    ) -> tuple[list[NewChunk], np.ndarray]:
    """`chunks` consecutive chunks of `tokens` random words, each word a token, with random token ids (KV file names
    hash them, and the same ids are taken for the same KV), random KV [layers, T, heads, head dim] (`kv_shape`:
    layers, heads, head dim) and unit embeddings [N, DIM]."""
    gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    layers, heads, head_dim = kv_shape
    out, text_at = [], 0
    for _ in range(chunks):
        words = [f"w{int(x)}" for x in rng.integers(0, 1000, tokens)]
        text = " ".join(words)
        offsets, at = [], 0
        for word in words:
            offsets.append((at, at + len(word)))
            at += len(word) + 1
        kv = ChunkKV(torch.randn(layers, tokens, heads, head_dim, generator=gen),
                     torch.randn(layers, tokens, heads, head_dim, generator=gen))
        out.append(NewChunk(text=text, char_start=text_at, char_end=text_at + len(text),
                            token_ids=[int(x) for x in rng.integers(0, 50_000, tokens)], offsets=offsets, kv=kv))
        text_at += len(text) + 1
    vectors = rng.normal(size=(chunks, DIM)).astype(np.float32)
    return out, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
