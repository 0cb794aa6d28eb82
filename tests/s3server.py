"""An S3-compatible server for tests (moto's standalone `moto_server`, a process of its own on a free port), and
small synthetic chunks for tests of stores that need no model."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent


class S3Server:
    """`moto_server` on a free local port; `env` is the environment a client process needs to reach it."""

    def __init__(self, workdir: Path):
        exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "moto.log", "w")
        self.process = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)], stdout=self.log,
                                        stderr=subprocess.STDOUT)
        self.env = {**os.environ, "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), str(TESTS.parent),
                                                                os.environ.get("PYTHONPATH")]))}
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {(workdir / 'moto.log').read_text()[-500:]}")
                time.sleep(0.2)

    def bucket_url(self, name: str) -> str:
        """A new bucket's URL, `s3://<name>`."""
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=name)
        return f"s3://{name}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


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
