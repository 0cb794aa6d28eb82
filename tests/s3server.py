"""The tests' S3-compatible server (`lab.s3server.S3Server`, with the tests' folder on the path of the processes
it serves), and small synthetic chunks for tests of stores that need no model."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lab.s3server import S3Server as _S3Server

TESTS = Path(__file__).resolve().parent


class S3Server(_S3Server):
    def __init__(self, workdir: Path):
        super().__init__(workdir)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), str(TESTS.parent),
                                                                os.environ.get("PYTHONPATH")]))


def settings_for(fingerprint: str, dim: int = 8):
    from cagkit.store.store import StoreSettings

    return StoreSettings(source="fake", source_fingerprint=fingerprint, dtype="float16", chunk_tokens=8,
                         embedder=f"fake-{dim}")


def fake_chunks(text: str, seed: int, dim: int = 8, layers: int = 2, heads: int = 1, head_dim: int = 4):
    """`text` cut into chunks at full stops, each with random KV [L, T, H, D], one token per word, and unit
    embeddings [N, dim]: what a writer stores, without a model."""
    import torch

    from cagkit.kv.chunk import ChunkKV
    from cagkit.store.store import NewChunk

    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    chunks, start = [], 0
    for piece in [p for p in text.split(".") if p.strip()]:
        begin = text.index(piece, start)
        end = begin + len(piece)
        start = end
        words, offsets, pos = piece.split(), [], 0
        for w in words:
            at = piece.index(w, pos)
            offsets.append((at, at + len(w)))
            pos = at + len(w)
        n = len(words)
        kv = ChunkKV(torch.randn(layers, n, heads, head_dim, generator=gen),
                     torch.randn(layers, n, heads, head_dim, generator=gen))
        chunks.append(NewChunk(text=piece, char_start=begin, char_end=end,
                               token_ids=[int(x) for x in rng.integers(0, 1000, n)], offsets=offsets, kv=kv))
    vectors = rng.normal(size=(len(chunks), dim)).astype(np.float32)
    return chunks, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
