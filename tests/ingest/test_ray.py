"""`cagkit ingest --ray` (issue 33): a local Ray with two actors writes a LanceDB store, on disk or on S3, that
answers as the local ingest's does; a run killed mid-way leaves it consistent and the next run completes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

pytest.importorskip("ray")
pytest.importorskip("lance_ray")

from cagkit.ingest.distributed import ingest_ray  # noqa: E402
from cagkit.ingest.pipeline import ingest  # noqa: E402
from cagkit.retrieval.search import retrieve  # noqa: E402
from cagkit.store.store import Store, StoreSettings  # noqa: E402

TEXTS = {
    "lighthouse.md": "The lighthouse on Kerrow Point was built in 1871 by the engineer Mara Ellison.\n\n"
                     "It is 41 metres tall, and its light can be seen from thirty kilometres away.",
    "bakery.txt": "The bakery on Mill Street sells rye bread every Tuesday and Friday morning.\n\n"
                  "Its oven was brought from Vienna in 1923 by a baker named Josef Weber.",
    "ferry.txt": "The ferry to Inish Mor leaves at nine. It returns at six in summer.\n\n"
                 "Tickets cost twelve euro. Bicycles travel free on weekdays.",
    "garden.md": "The walled garden holds four hundred roses. Its gate opens at ten.",
}


@pytest.fixture(scope="module")
def tiny_dir(tiny_llama, tmp_path_factory):
    """The tiny Llama saved as a model folder, which Ray's worker processes load by path."""
    folder = tmp_path_factory.mktemp("tiny-llama-model")
    tiny_llama.model.save_pretrained(folder)
    tiny_llama.tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def docs(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in TEXTS.items():
        (folder / name).write_text(text)
    return folder


def _state(store):
    with Store.open(store) as st:
        found = st.verify()
        docs = {os.path.basename(d.path): (d.sha256, d.n_chunks, d.prefill, d.window) for d in st.documents()}
        return found, docs, st.num_chunks()


def test_a_ray_ingest_with_two_actors_matches_the_local_ingest(tiny_dir, docs, tmp_path):
    local = ingest([docs], store=tmp_path / "local", source=tiny_dir, chunk_tokens=32, progress=False,
                   manifest="lance")
    report = ingest_ray([docs], tmp_path / "ray", actors=2, source=tiny_dir, chunk_tokens=32, progress=False)
    assert sorted(report.added) == sorted(local.added) and report.chunks == local.chunks
    found, by_ray, chunks = _state(tmp_path / "ray")
    assert found["ok"] and not found["orphans"] and by_ray == _state(tmp_path / "local")[1] and chunks == local.chunks
    assert {prefill for *_, prefill, _ in by_ray.values()} == {"document"}  # each document read whole by one actor
    with Store.open(tmp_path / "ray") as a, Store.open(tmp_path / "local") as b:
        for question in ("Who built the lighthouse?", "When does the ferry leave?"):
            ha, hb = retrieve(a, question, 2, "hybrid"), retrieve(b, question, 2, "hybrid")
            assert [(h.doc_path, h.idx) for h in ha] == [(h.doc_path, h.idx) for h in hb]
        for doc in b.documents():
            for ca, cb in zip(a.load_chunks(a.chunk_ids(doc.path)), b.load_chunks(b.chunk_ids(doc.path)), strict=True):
                assert ca.context is not None and ca.context == cb.context
                torch.testing.assert_close(ca.kv.keys, cb.kv.keys, rtol=0, atol=0)
    again = ingest_ray([docs], tmp_path / "ray", actors=2, source=tiny_dir, chunk_tokens=32, progress=False)
    assert len(again.unchanged) == len(TEXTS) and not again.added
    (docs / "garden.md").write_text("The walled garden closed in 2020.")
    changed = ingest_ray([docs], tmp_path / "ray", actors=1, source=tiny_dir, chunk_tokens=32, progress=False)
    assert [os.path.basename(p) for p in changed.updated] == ["garden.md"] and len(changed.unchanged) == 3
    found, by_ray, _ = _state(tmp_path / "ray")
    assert found["ok"] and len(by_ray) == len(TEXTS)


def test_a_ray_ingest_into_s3(tiny_dir, docs, s3):
    url = s3.bucket_url("rayingest") + "/store"
    report = ingest_ray([docs], url, actors=2, source=tiny_dir, chunk_tokens=32, progress=False, prefill="chunks")
    assert len(report.added) == len(TEXTS)
    found, by_ray, _ = _state(url)
    assert found["ok"] and len(by_ray) == len(TEXTS)
    assert {(prefill, window) for *_, prefill, window in by_ray.values()} == {("chunks", None)}
    with Store.open(url) as st:
        assert all(c.context is None for d in st.documents() for c in st.load_chunks(st.chunk_ids(d.path)))


# About 700 tokens: with chunks of 32 tokens and a window of 200, read in parts of 84 tokens at most, sliding.
HARBOUR = " ".join(f"Sentence {i} tells of harbour town {i} and its {i * 3} boats." for i in range(40))
WINDOW = 200


def test_parts_an_interrupted_run_wrote_are_read_back_into_the_window_not_prefilled_again(tiny_llama, tmp_path):
    """A Ray actor (here in this process) that finds parts of its document written by an earlier run reuses their
    files and feeds their KV into the window (`DocumentPrefill.skip`, sliding as it fills): the parts after them
    attend to that KV exactly."""
    import pyarrow as pa
    from safetensors import safe_open
    from safetensors.torch import save_file

    from cagkit.ingest.distributed import _Prefiller
    from cagkit.retrieval.embeddings import EMBEDDER_NAME
    from cagkit.store import lance

    doc = tmp_path / "harbour.txt"
    doc.write_text(HARBOUR)
    settings = StoreSettings(source="tiny-llama", source_fingerprint=tiny_llama.fingerprint, dtype="float32",
                             chunk_tokens=32, embedder=EMBEDDER_NAME)  # float32: what is read back is exact

    def run(store, left=None):
        lance.LanceStore.open_for_writing(store, settings).close()
        for name, (tensors, meta) in (left or {}).items():  # what a run killed after those parts left
            (store / "kv").mkdir(exist_ok=True)
            save_file(tensors, store / "kv" / name, metadata=meta)
        return _Prefiller(str(store), "tiny-llama", settings, None, "document", WINDOW)(
            pa.table({"path": [str(doc)]})).to_pylist()

    def part(name):
        with safe_open(tmp_path / "whole" / "kv" / name, "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()

    whole = run(tmp_path / "whole")
    parts = list(dict.fromkeys(r["kv_file"] for r in whole))
    assert len(parts) > 3 and {(r["doc_prefill"], r["doc_window"]) for r in whole} == {("document", WINDOW)}
    # every part but the last left: the window slides over them before the last part is read
    resumed = run(tmp_path / "resumed", {name: part(name) for name in parts[:-1]})
    assert [(r["kv_file"], r["checksum"]) for r in resumed] == [(r["kv_file"], r["checksum"]) for r in whole]
    # the first part left, changed where it lies: it is kept as found, and the parts after it read what it holds
    tensors, meta = part(parts[0])
    changed = {k: v + 0.5 if k.endswith(".values") else v for k, v in tensors.items()}
    found = run(tmp_path / "changed", {parts[0]: (changed, meta)})
    assert [r["kv_file"] for r in found] == [r["kv_file"] for r in whole]
    with safe_open(tmp_path / "changed" / "kv" / parts[0], "pt") as f:
        assert all(torch.equal(f.get_tensor(k), v) for k, v in changed.items())
    assert all(a["checksum"] != b["checksum"] for a, b in zip(found, whole))
    with lance.LanceStore.open_for_writing(tmp_path / "changed", settings) as st:
        st.commit_rows(found, replace=[str(doc)])
    with Store.open(tmp_path / "changed") as st:
        (stored,) = st.documents()
        assert (stored.prefill, stored.window) == ("document", WINDOW) and st.verify()["ok"]


def test_a_ray_worker_killed_mid_ingest_leaves_the_store_consistent(tiny_dir, docs, tmp_path):
    """Kill one of the actors' processes while they prefill: whatever the run does then (Ray may restart the
    actor and finish, or fail), the store verifies, and the next run holds every document once."""
    for n in range(12):  # more documents, so that the kill lands while the actors are busy
        (docs / f"extra{n}.txt").write_text(f"Note {n}. " + " ".join(f"word{n}x{i}" for i in range(120)))
    store = tmp_path / "ray"
    code = textwrap.dedent(f"""
        import json
        from cagkit.ingest.distributed import ingest_ray
        r = ingest_ray([{str(docs)!r}], {str(store)!r}, actors=2, source={tiny_dir!r}, chunk_tokens=32,
                       progress=False)
        print(json.dumps({{"added": len(r.added)}}))
    """)
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    killed = _kill_an_actor(store / "kv", deadline=time.monotonic() + 240)
    out, err = run.communicate(timeout=600)
    assert killed, f"no actor was found to kill; the run said: {err[-1500:]}"
    found, _, _ = _state(store)  # the kill came after the first KV file, so the store exists
    assert found["ok"], found
    report = ingest_ray([docs], store, actors=2, source=tiny_dir, chunk_tokens=32, progress=False)
    found, by_ray, chunks = _state(store)
    assert found["ok"] and len(by_ray) == len(TEXTS) + 12, (report, json.dumps(found)[:500])
    assert chunks == sum(n for _, n, *_ in by_ray.values())


def _kill_an_actor(kv, deadline: float) -> bool:
    """SIGKILL one Ray actor process prefilling (named ray::_Prefiller or a Ray Data map worker) once the first
    KV file is written."""
    while time.monotonic() < deadline:
        if kv.is_dir() and any(kv.iterdir()):
            out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
            pids = [int(line.split()[0]) for line in out.splitlines()[1:]
                    if "ray::" in line and ("Prefiller" in line or "MapWorker" in line)]
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                return True
        time.sleep(0.05)
    return False


def test_ray_ingest_into_a_sqlite_store_is_a_one_line_error(tiny_llama, docs, tmp_path, capsys):
    from cagkit.cli import main

    ingest([docs], store=tmp_path / "sqlite", source="tiny-llama", chunk_tokens=32, progress=False)
    assert main(["ingest", str(docs), "--store", str(tmp_path / "sqlite"), "--source", "tiny-llama",
                 "--chunk-tokens", "32", "--ray", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading bar
    assert err.startswith("error: store ") and "store migrate" in err and "SQLite" in err
    assert main(["ingest", str(docs), "--store", str(tmp_path / "x"), "--source", "tiny-llama", "--ray",
                 "--actors", "0"]) == 2
    assert "--actors must be at least 1" in capsys.readouterr().err
    assert main(["ingest", str(docs), "--store", str(tmp_path / "x"), "--source", "tiny-llama", "--ray",
                 "--window", "40"]) == 2  # refused before Ray starts: the window has no room for two chunks
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --window 40 is too small") and not (tmp_path / "x").exists()
