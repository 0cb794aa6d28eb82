"""Reading a question's chunks from a LanceDB store on S3: one at a time (a manifest query and a KV file read per
chunk, waiting for each other, as cagkit read them before) against `load_chunks` (one query, the files read side
by side), in the same run, alternating, on an S3-compatible server (moto) on this machine. A real S3 adds tens of
milliseconds to every request, which only the serial path pays once per chunk. No model is loaded: the chunks
hold random KV of gemma's size (18 layers, one 256-dim head, 128 tokens a chunk).

    python benchmarks/s3_reads.py --chunks 16 --repeats 5 [--out results/s3_reads.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from cagkit.store.store import Store
from cagkit.bench import write_results
from lab.s3server import S3Server
from lab.synthetic import random_document, settings

SETTINGS = settings("reads", chunk_tokens=128)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=16, help="chunks a question reads (its top-k)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    server = S3Server(Path(tempfile.mkdtemp(prefix="cagkit-s3-")))
    os.environ.update(server.env)
    try:
        url = server.bucket_url("reads") + "/store"
        with Store.open_for_writing(url, SETTINGS) as store:
            for n in range(4):
                store.write_document(f"doc{n}", f"{n:064d}",
                                     *random_document(n, args.chunks // 4 + 1, tokens=128, kv_shape=(18, 1, 256)))
        with Store.open(url) as store:
            hits = store.search(np.full(8, 8 ** -0.5, dtype=np.float32), top_k=args.chunks)
            ids = [h.chunk_id for h in hits]
            one_at_a_time, together = [], []
            for _ in range(args.repeats):
                started = time.perf_counter()
                serial = [store.load_chunks([i])[0] for i in ids]
                one_at_a_time.append(time.perf_counter() - started)
                started = time.perf_counter()
                batch = store.load_chunks(ids)
                together.append(time.perf_counter() - started)
                assert [c.chunk_id for c in serial] == [c.chunk_id for c in batch] == ids
    finally:
        server.stop()
    summary = {"chunks": len(ids), "repeats": args.repeats,
               "one_at_a_time_ms_median": round(statistics.median(one_at_a_time) * 1e3, 1),
               "load_chunks_ms_median": round(statistics.median(together) * 1e3, 1),
               "speedup": round(statistics.median(one_at_a_time) / statistics.median(together), 2)}
    print(json.dumps(summary, indent=2))
    if args.out:
        write_results(args.out, summary)


if __name__ == "__main__":
    main()
