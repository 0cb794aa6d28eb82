"""Retrieval at scale: cagkit's exact numpy scan against a LanceDB IVF_PQ index, on the same synthetic embeddings.

For each N in --sizes, N synthetic chunk embeddings (384-dim float32, unit-normalised, like all-MiniLM-L6-v2's)
are drawn from a seeded mixture of Gaussian clusters; the queries are fresh draws from the same mixture (a
question is near some chunks but equal to none). Measured, each in a fresh worker process so that its RSS is its
own:

- exact: what `Store.search` does now for dense retrieval: one matrix-vector product over every embedding and
  `cagkit.retrieval.rank.rank` (a stable argsort of all scores); also the same product with `np.argpartition`.
- lancedb: table creation on local disk, IVF_PQ index build (num_partitions about sqrt(N)), then top-10 queries
  for a few (nprobes, refine_factor) settings, with recall@10 against the exact top-10.

Runtime code is not touched; lancedb is not a cagkit dependency (`.venv/bin/pip install lancedb`).

    OMP_NUM_THREADS=1 python benchmarks/retrieval_scale.py --sizes 20000 --queries 50 --out /tmp/rs.json
    OMP_NUM_THREADS=1 python benchmarks/retrieval_scale.py --sizes 100000,1000000

Results go to docs/results/retrieval-scale.json (the figures of docs/scale.md); a run of only some sizes keeps the
other sizes' results already in that file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

# One thread unless the caller says otherwise, for numpy and for Lance's own pools, set before they load.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LANCE_CPU_THREADS", "RAYON_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from cagkit.bench import machine, run_timed, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DIM = 384
TOP_K = 10
BATCH = 100_000
WARMUP = 5


def rss_mib() -> dict:
    """The process's resident set now and at its peak, MiB (Linux /proc)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key = "rss_mib" if line.startswith("VmRSS") else "peak_rss_mib"
                out[key] = round(int(line.split()[1]) / 1024, 1)
    return out


def percentiles(ms: list[float]) -> dict:
    a = np.asarray(ms)
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p95_ms": round(float(np.percentile(a, 95)), 3),
            "mean_ms": round(float(a.mean()), 3)}


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def mixture(n: int, centres: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """`n` unit vectors, each a random centre plus isotropic Gaussian noise of std `sigma` per dimension."""
    which = rng.integers(0, len(centres), size=n)
    return unit(centres[which] + sigma * rng.standard_normal((n, DIM), dtype=np.float32))


def make_data(n: int, n_queries: int, n_centres: int, sigma: float, seed: int, work: Path) -> tuple[Path, Path]:
    """Writes emb.npy [n, DIM] and queries.npy [n_queries, DIM] under `work` (kept between runs)."""
    emb_path, q_path = work / "emb.npy", work / "queries.npy"
    meta = {"n": n, "n_queries": n_queries, "n_centres": n_centres, "sigma": sigma, "seed": seed}
    meta_path = work / "data.json"
    if emb_path.exists() and q_path.exists() and meta_path.exists() and json.loads(meta_path.read_text()) == meta:
        return emb_path, q_path
    rng = np.random.default_rng(seed)
    centres = unit(rng.standard_normal((n_centres, DIM), dtype=np.float32))
    emb = np.lib.format.open_memmap(emb_path, mode="w+", dtype=np.float32, shape=(n, DIM))
    for s in range(0, n, BATCH):
        emb[s:s + BATCH] = mixture(min(BATCH, n - s), centres, sigma, rng)
    emb.flush()
    del emb
    np.save(q_path, mixture(n_queries, centres, sigma, np.random.default_rng(seed + 1)))
    meta_path.write_text(json.dumps(meta))
    return emb_path, q_path


def exact_topk(emb_path: Path, queries: np.ndarray) -> np.ndarray:
    """The exact top-k ids of every query (dot product of unit vectors = cosine), in blocks of the store."""
    emb = np.load(emb_path, mmap_mode="r")
    best_s = np.full((len(queries), TOP_K), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(queries), TOP_K), dtype=np.int64)
    for s in range(0, len(emb), BATCH):
        sc = queries @ np.asarray(emb[s:s + BATCH]).T  # [Q, B]
        cand_s = np.concatenate([best_s, sc], axis=1)
        cand_i = np.concatenate([best_i, np.broadcast_to(np.arange(s, s + sc.shape[1]), sc.shape)], axis=1)
        top = np.argpartition(-cand_s, TOP_K - 1, axis=1)[:, :TOP_K]
        best_s = np.take_along_axis(cand_s, top, axis=1)
        best_i = np.take_along_axis(cand_i, top, axis=1)
    return best_i


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t.tolist())) / TOP_K for f, t in zip(found, truth)]))


# ---- workers: each runs in a fresh process so that its RSS is what a reader of the store would hold ----

def worker_exact(emb_path: str, q_path: str) -> dict:
    from cagkit.retrieval.rank import rank

    base = rss_mib()
    t = time.perf_counter()
    emb = np.load(emb_path)  # the whole matrix in memory, as Store.search holds it
    load_s = time.perf_counter() - t
    queries = np.load(q_path)
    out = {"rss_before_load_mib": base["rss_mib"], "load_s": round(load_s, 3)}
    for name in ("rank", "argpartition"):
        ms = []
        for i, q in enumerate(np.concatenate([queries[:WARMUP], queries])):
            t = time.perf_counter()
            dense = emb @ q
            if name == "rank":  # cagkit's dense path: cagkit.retrieval.rank.rank
                best, _ = rank(dense, None, "dense", TOP_K)
            else:
                part = np.argpartition(-dense, TOP_K - 1)[:TOP_K]
                best = part[np.argsort(-dense[part])]  # noqa: F841 (timed, not used)
            if i >= WARMUP:
                ms.append((time.perf_counter() - t) * 1000)
        out[name] = percentiles(ms)
    out.update(rss_mib())
    return out


def worker_lance(db_path: str, q_path: str, metric: str, settings: list) -> dict:
    import lancedb

    base = rss_mib()
    t = time.perf_counter()
    table = lancedb.connect(db_path, storage_options=_storage(db_path)).open_table("chunks")
    open_s = time.perf_counter() - t
    queries = np.load(q_path)
    out = {"rss_before_open_mib": base["rss_mib"], "open_s": round(open_s, 3), "settings": []}
    for nprobes, refine in settings:
        ms, ids = [], []
        for i, q in enumerate(np.concatenate([queries[:WARMUP], queries])):
            t = time.perf_counter()
            b = table.search(q).distance_type(metric).nprobes(nprobes).limit(TOP_K).select(["id"])
            if refine:
                b = b.refine_factor(refine)
            got = b.to_arrow()["id"].to_pylist()
            if i >= WARMUP:
                ms.append((time.perf_counter() - t) * 1000)
                ids.append(got)
        out["settings"].append({"nprobes": nprobes, "refine_factor": refine, **percentiles(ms), "ids": ids,
                                **rss_mib()})
    out.update(rss_mib())
    return out


def run_worker(kind: str, *args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, json.dumps([str(a) if isinstance(a, Path) else a for a in args])]
    proc, _ = run_timed(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"worker {kind} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- one size ----

def _storage(db_path) -> dict:
    """LanceDB's options for a table on the S3-compatible server of --s3 (plain HTTP on this machine)."""
    return {"allow_http": "true"} if str(db_path).startswith("s3://") else {}


def lance_build(emb_path: Path, db_path) -> dict:
    import lancedb
    import pyarrow as pa

    if not str(db_path).startswith("s3://") and Path(db_path).exists():
        shutil.rmtree(db_path)
    emb = np.load(emb_path, mmap_mode="r")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("vector", pa.list_(pa.float32(), DIM))])

    def batches():
        for s in range(0, len(emb), BATCH):
            block = np.ascontiguousarray(emb[s:s + BATCH])
            vec = pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), DIM)
            yield pa.record_batch([pa.array(np.arange(s, s + len(block), dtype=np.int64)), vec], schema=schema)

    t = time.perf_counter()
    db = lancedb.connect(str(db_path), storage_options=_storage(db_path))
    table = db.create_table("chunks", data=pa.RecordBatchReader.from_batches(schema, batches()))
    create_s = time.perf_counter() - t
    return {"table": table, "create_s": round(create_s, 2), "rows": table.count_rows()}


def disk_mib(path) -> float | None:
    if str(path).startswith("s3://"):
        return None
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 1)


def run_size(n: int, args, save) -> dict:
    """Measures one size; `save(res)` writes what is done so far (a long index build may be cut short)."""
    work = Path(args.workdir) / f"n{n}"
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"n": n}
    t = time.perf_counter()
    emb_path, q_path = make_data(n, args.queries, args.centres, args.sigma, args.seed, work)
    res["data_s"] = round(time.perf_counter() - t, 2)
    queries = np.load(q_path)
    t = time.perf_counter()
    truth = exact_topk(emb_path, queries)
    res["ground_truth_s"] = round(time.perf_counter() - t, 2)
    # How hard the mixture makes the search: the cosine of the 1st and 10th exact neighbours.
    emb = np.load(emb_path, mmap_mode="r")
    sims = np.stack([np.asarray(emb[np.sort(ids)]) @ q for ids, q in zip(truth, queries)])  # [Q, K]
    sims.sort(axis=1)
    res["neighbour_cosine"] = {"top1_mean": round(float(sims[:, -1].mean()), 4),
                               "top10_mean": round(float(sims[:, 0].mean()), 4)}
    del emb

    print(f"[{n}] exact scan ...", flush=True)
    res["exact"] = run_worker("exact", emb_path, q_path)
    res["exact"]["embeddings_mib"] = round(n * DIM * 4 / 2**20, 1)
    save(res)
    print(f"[{n}] exact: rank p50 {res['exact']['rank']['p50_ms']} ms, rss {res['exact']['rss_mib']} MiB", flush=True)

    if args.no_lance:
        return res
    try:
        import lancedb
    except ImportError:
        raise SystemExit("lancedb is not installed: .venv/bin/pip install lancedb (or run with --no-lance)")
    db_path = f"{args.s3}/n{n}" if args.s3 else work / "lancedb"
    print(f"[{n}] lancedb: creating the table at {db_path} ...", flush=True)
    built = lance_build(emb_path, db_path)
    table = built.pop("table")
    lance = {"version": lancedb.__version__, "metric": args.metric, "where": "s3 (moto on this machine)" if args.s3
             else "local disk", **built, "indexes": []}
    lance["table_disk_mib"] = disk_mib(db_path)
    res["lancedb"] = lance
    save(res)
    partitions = args.partitions or max(1, int(round(np.sqrt(n))))
    settings = [(p, r) for p in args.nprobes for r in args.refine]
    for sub in args.sub_vectors:
        print(f"[{n}] lancedb: IVF_PQ partitions={partitions} sub_vectors={sub} ...", flush=True)
        t = time.perf_counter()
        with warnings.catch_warnings():  # the keyword form is deprecated in 0.40 but still the plain one
            warnings.simplefilter("ignore", DeprecationWarning)
            table.create_index(metric=args.metric, vector_column_name="vector", num_partitions=partitions,
                               num_sub_vectors=sub, index_type="IVF_PQ", replace=True)
        build_s = time.perf_counter() - t
        entry = {"index_type": "IVF_PQ", "num_partitions": partitions, "num_sub_vectors": sub, "num_bits": 8,
                 "max_iterations": 50, "sample_rate": 256,  # LanceDB's defaults, not passed
                 "build_s": round(build_s, 2), "disk_mib_after": disk_mib(db_path)}
        q = run_worker("lance", db_path, q_path, args.metric, settings)
        for s in q["settings"]:
            s["recall_at_10"] = round(recall(s.pop("ids"), truth), 4)
            print(f"[{n}]   nprobes={s['nprobes']} refine={s['refine_factor']}: p50 {s['p50_ms']} ms "
                  f"p95 {s['p95_ms']} ms recall@10 {s['recall_at_10']}", flush=True)
        entry["query"] = q
        lance["indexes"].append(entry)
        save(res)
    if not args.keep and not args.s3:
        shutil.rmtree(db_path, ignore_errors=True)
    return res


def table_lines(sizes: list[dict]) -> list[str]:
    lines = [f"{'N':>9} {'method':<34} {'p50 ms':>8} {'p95 ms':>8} {'recall@10':>9} {'RSS MiB':>8}"]
    for r in sizes:
        e = r["exact"]
        for name in ("rank", "argpartition"):
            lines.append(f"{r['n']:>9} {'exact numpy (' + name + ')':<34} {e[name]['p50_ms']:>8.2f} "
                         f"{e[name]['p95_ms']:>8.2f} {1.0:>9.3f} {e['rss_mib']:>8.0f}")
        for idx in r.get("lancedb", {}).get("indexes", []):
            for s in idx["query"]["settings"]:
                label = f"ivf_pq p{idx['num_partitions']} m{idx['num_sub_vectors']} np{s['nprobes']} rf{s['refine_factor'] or '-'}"
                lines.append(f"{r['n']:>9} {label:<34} {s['p50_ms']:>8.2f} {s['p95_ms']:>8.2f} "
                             f"{s['recall_at_10']:>9.3f} {s['rss_mib']:>8.0f}")
        if "lancedb" in r:
            lb = r["lancedb"]
            builds = ", ".join(f"m{i['num_sub_vectors']} {i['build_s']} s" for i in lb["indexes"])
            lines.append(f"{r['n']:>9} lancedb create {lb['create_s']} s; index build {builds}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000", help="comma-separated numbers of chunks")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--centres", type=int, default=2000, help="Gaussian centres of the mixture")
    ap.add_argument("--sigma", type=float, default=0.05, help="noise std per dimension around a centre")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--metric", default="dot", help="LanceDB distance (vectors are unit: dot = cosine)")
    ap.add_argument("--partitions", type=int, default=0, help="IVF partitions (default round(sqrt(N)))")
    ap.add_argument("--sub-vectors", default="48", help="comma-separated PQ sub-vectors, each index built in turn")
    ap.add_argument("--nprobes", default="20,50,100", help="comma-separated nprobes to query with")
    ap.add_argument("--refine", default="0,10", help="comma-separated refine_factor (0 = none)")
    ap.add_argument("--no-lance", action="store_true", help="only the exact scan")
    ap.add_argument("--workdir", default="/tmp/cagkit-retrieval-scale", help="synthetic data and tables")
    ap.add_argument("--keep", action="store_true", help="keep the LanceDB tables after the run")
    ap.add_argument("--s3", action="store_true", help="the LanceDB tables on an S3-compatible server (moto, started "
                                                      "here) instead of local disk; results to retrieval-scale-s3.json")
    ap.add_argument("--out", default=None, help="results file (default: docs/results/retrieval-scale.json, or "
                                                "retrieval-scale-s3.json with --s3)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("worker_args", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        fn = {"exact": worker_exact, "lance": worker_lance}[args.worker]
        print(json.dumps(fn(*json.loads(args.worker_args))))
        return
    args.out = args.out or str(ROOT / "docs/results" / ("retrieval-scale-s3.json" if args.s3 else "retrieval-scale.json"))
    server = None
    if args.s3:
        from lab.s3server import S3Server

        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        server = S3Server(Path(args.workdir))
        os.environ.update({k: server.env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                      "AWS_DEFAULT_REGION")})
        args.s3 = server.bucket_url("retrieval-scale")
    args.sub_vectors = [int(x) for x in args.sub_vectors.split(",") if x]
    args.nprobes = [int(x) for x in args.nprobes.split(",") if x]
    args.refine = [int(x) or None for x in args.refine.split(",") if x]
    sizes = [int(x.replace("_", "")) for x in args.sizes.split(",") if x]
    if not args.no_lance:
        try:
            import lancedb  # noqa: F401
        except ImportError:
            raise SystemExit("lancedb is not installed: .venv/bin/pip install lancedb (or run with --no-lance)")

    out_path = Path(args.out)
    previous = json.loads(out_path.read_text()) if out_path.exists() else {}
    results = {r["n"]: r for r in previous.get("sizes", [])}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start = os.getloadavg()

    def save(r: dict, partial: bool = True) -> dict:
        r = {**r, "partial": partial, "run": {"started_utc": started, "loadavg_start": [round(x, 2) for x in load_start],
                                              ("loadavg_now" if partial else "loadavg_end"): [round(x, 2) for x in os.getloadavg()]}}
        results[r["n"]] = r
        doc = {
            "benchmark": "benchmarks/retrieval_scale.py",
            "what": "dense top-10 retrieval over synthetic unit-normalised 384-dim float32 embeddings: cagkit's "
                    "exact numpy scan against LanceDB IVF_PQ on local disk (or, with --s3, on an S3-compatible server); "
                    "recall@10 against the exact top-10",
            "settings": {"dim": DIM, "top_k": TOP_K, "queries": args.queries, "warmup_queries": WARMUP,
                         "centres": args.centres, "sigma": args.sigma, "seed": args.seed, "metric": args.metric,
                         "queries_are": "fresh draws from the same mixture (not copies of stored vectors)",
                         "threads": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "LANCE_CPU_THREADS", "RAYON_NUM_THREADS")},
                         "latency": "wall time per query in a fresh reader process, after warm-up queries; lancedb "
                                    "includes building the query and converting the result to Arrow",
                         "rss": "VmRSS of that reader process after its queries"},
            "machine": machine(numpy=np.__version__),
            "sizes": [results[k] for k in sorted(results)],
        }
        write_results(out_path, doc)
        return doc

    doc = None
    try:
        for n in sizes:
            t = time.perf_counter()
            r = run_size(n, args, save)
            r["wall_s"] = round(time.perf_counter() - t, 1)
            doc = save(r, partial=False)
    finally:
        if server is not None:
            server.stop()
    if doc is None:
        return
    print("\n".join(table_lines(doc["sizes"])))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
