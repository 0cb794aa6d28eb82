"""Writers racing into a new LanceDB store: each race opens a fresh local store for W writers, and at one moment
(a barrier) each commits one document. The first commit creates the manifest's table, so every race is also a race
to create it: Lance commits a second creation as an overwrite, and a table can be listed before it can be opened.
Counts the races in which a document was missing afterwards, the writers that failed (with their first error),
and how many table versions each race left (a race that overwrote and put rows back leaves more). No model is
loaded: the chunks hold random KV.

    python benchmarks/lance_race.py --races 40 --writers 2 [--out results/lance_race.json]   # about a minute
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
from collections import Counter
from pathlib import Path

from cagkit.store.store import Store
from cagkit.bench import write_results
from lab.synthetic import random_document, settings

SETTINGS = settings("race", chunk_tokens=8)


def race(folder: Path, writers: int) -> tuple[bool, list[str], int]:
    """One race into a new store at `folder`: (every document there, the writers' errors, table versions)."""
    stores = [Store.open_for_writing(folder, SETTINGS, manifest="lance") for _ in range(writers)]
    start, errors = threading.Barrier(writers), []

    def write(i: int) -> None:
        chunks, vectors = random_document(i, chunks=3, tokens=5)
        start.wait()
        try:
            stores[i].write_document(f"d{i}", f"{i:064d}", chunks, vectors)
        except Exception as exc:  # noqa: BLE001 - counted, not raised
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in stores:
        store.close()
    with Store.open(folder) as store:
        complete = [d.path for d in store.documents()] == [f"d{i}" for i in range(writers)]
        versions = len(store._fresh().list_versions())
    return complete, errors, versions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--races", type=int, default=40)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the summary here as JSON")
    args = ap.parse_args()
    lost, errors, versions = 0, [], Counter()
    with tempfile.TemporaryDirectory(prefix="cagkit-race-") as tmp:
        for n in range(args.races):
            folder = Path(tmp) / f"store{n}"
            complete, failed, count = race(folder, args.writers)
            lost += not complete
            errors += failed
            versions[count] += 1
            shutil.rmtree(folder)
    summary = {"races": args.races, "writers": args.writers, "races_with_a_document_missing": lost,
               "writer_errors": len(errors), "first_error": errors[0] if errors else None,
               "table_versions": {str(k): v for k, v in sorted(versions.items())}}
    print(json.dumps(summary, indent=2))
    if args.out:
        write_results(args.out, summary)


if __name__ == "__main__":
    main()
