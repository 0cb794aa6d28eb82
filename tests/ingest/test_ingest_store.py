"""Ingest into a store and read it back: incremental, crash-safe, and strict about what built the store."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from conftest import BAKERY
from conftest import ingest_docs as _ingest

from cagkit.ask import ask
from cagkit.errors import CagkitError, StoreError
from cagkit.ingest.pipeline import ingest
from cagkit.kv.prefill import prefill_kv
from cagkit.models.loading import LoadedModel, register_loaded
from cagkit.retrieval.search import retrieve
from cagkit.store.store import Store


def test_ingest_stores_rope_free_kv_that_matches_a_fresh_prefill(tiny_llama, docs, tmp_path):
    """With `--prefill chunks`, as stores were written before document caches: each chunk alone at 0..T-1.
    tests/kv/test_document.py checks the default, documents prefilled whole."""
    store = tmp_path / "store"
    report = _ingest(docs, store, prefill="chunks")
    assert len(report.added) == 2 and report.chunks == 4
    with Store.open(store) as st:
        assert st.settings.source_fingerprint == "tiny-llama-fp"
        doc = st.document(str((docs / "lighthouse.md").resolve()))
        chunk = st.load_chunk(st.chunk_ids(doc.path)[0])
        assert chunk.text == "The lighthouse on Kerrow Point was built in 1871 by the engineer Mara Ellison."
        assert chunk.kv.keys.dtype == torch.float16
        fresh = prefill_kv(tiny_llama.model, chunk.token_ids)
        torch.testing.assert_close(chunk.kv.keys.float(), fresh.keys, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(chunk.kv.values.float(), fresh.values, atol=2e-3, rtol=2e-3)
        # offsets are char spans of the source tokens inside the chunk text
        start, end = chunk.offsets[-1].tolist()
        assert chunk.text[start:end].strip() == "."
        assert chunk.context is None and doc.prefill == "chunks"


def test_store_files_are_as_readable_as_the_umask_allows(tiny_llama, docs, tmp_path):
    # safetensors alone writes owner-only files, which another user sharing the store could not read
    old = os.umask(0o022)
    try:
        _ingest(docs, tmp_path / "store")
    finally:
        os.umask(old)
    kv_files = list((tmp_path / "store" / "kv").iterdir())
    assert len(kv_files) == 2 and all(f.suffix == ".safetensors" for f in kv_files)  # no temporary file left
    assert {oct(f.stat().st_mode & 0o777) for f in kv_files} == {"0o644"}


@pytest.mark.parametrize("proc_status", ["/proc/self/status", "/nonexistent/status"])
def test_default_file_mode_follows_the_umask_without_changing_it(proc_status, monkeypatch):
    from cagkit import files

    monkeypatch.setattr(files, "_PROC_STATUS", proc_status)  # Linux's report, and the fallback elsewhere
    old = os.umask(0o027)
    try:
        assert files.default_file_mode() == 0o640
        assert os.umask(0o027) == 0o027  # read, not left changed
    finally:
        os.umask(old)


def test_retrieval_finds_the_chunk_with_the_fact(tiny_llama, docs, tmp_path):
    _ingest(docs, tmp_path / "store")
    with Store.open(tmp_path / "store") as st:
        hits = retrieve(st, "Where did the bakery's oven come from?", top_k=2)
    assert "Vienna" in hits[0].text
    assert hits[0].score >= hits[1].score


def test_reingest_skips_unchanged_replaces_changed_and_prunes(tiny_llama, docs, tmp_path):
    store = tmp_path / "store"
    _ingest(docs, store)
    again = _ingest(docs, store)
    assert again.added == [] and len(again.unchanged) == 2 and again.chunks == 0

    (docs / "bakery.txt").write_text(BAKERY + "\n\nIt closes at noon.")
    (docs / "lighthouse.md").unlink()
    changed = _ingest(docs, store)
    assert [p.endswith("bakery.txt") for p in changed.updated] == [True]
    with Store.open(store) as st:
        assert len(st.documents()) == 2  # without --prune the vanished document stays
    pruned = _ingest(docs, store, prune=True)
    assert [p.endswith("lighthouse.md") for p in pruned.removed] == [True]
    with Store.open(store) as st:
        assert [d.path.endswith("bakery.txt") for d in st.documents()] == [True]
        assert len(list((store / "kv").iterdir())) == 1


def test_store_built_by_another_source_is_refused(tiny_llama, docs, tmp_path):
    store = tmp_path / "store"
    _ingest(docs, store)
    register_loaded("other-llama", LoadedModel("other-llama", tiny_llama.model, tiny_llama.tokenizer, "other-fp", True))
    with pytest.raises(StoreError, match=r"built with source model 'tiny-llama'.*--source tiny-llama"):
        ingest([docs], store=store, source="other-llama", chunk_tokens=32, progress=False)
    with pytest.raises(StoreError, match="chunk_tokens=32, not 64"):
        ingest([docs], store=store, source="tiny-llama", chunk_tokens=64, progress=False)


def test_damaged_kv_file_is_reported_and_rebuilt_by_the_next_ingest(tiny_llama, docs, tmp_path):
    store = tmp_path / "store"
    _ingest(docs, store)
    with Store.open(store) as st:
        doc = st.document(str((docs / "bakery.txt").resolve()))
        kv_file = store / "kv" / doc.kv_file
        kv_file.write_bytes(kv_file.read_bytes()[:200])  # truncated
        with pytest.raises(StoreError, match=rf"{kv_file.name}.*damaged.*cagkit ingest"):
            st.load_chunk(st.chunk_ids(doc.path)[0])
    report = _ingest(docs, store)
    assert [p.endswith("bakery.txt") for p in report.updated] == [True]
    with Store.open(store) as st:
        assert st.load_chunk(st.chunk_ids(doc.path)[0]).kv.keys.shape[0] == tiny_llama.num_layers


def test_bad_inputs_give_clear_errors_and_lose_nothing(tiny_llama, docs, tmp_path):
    store = tmp_path / "store"
    _ingest(docs, store)
    (docs / "blob.txt").write_bytes(b"\x00\x01binary")
    (docs / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.warns(UserWarning) as caught:
        report = _ingest(docs, store)
    warned = " ".join(str(w.message) for w in caught)
    assert "blob.txt" in warned and "latin1.txt: not valid UTF-8 (byte 0xe9 at offset 3)" in warned
    assert sorted(os.path.basename(p) for p, _ in report.failed) == ["blob.txt", "latin1.txt"]
    with Store.open(store) as st:
        assert len(st.documents()) == 2

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CagkitError, match="empty"):
        _ingest(empty, store)
    with pytest.raises(CagkitError, match="missing-folder"):
        _ingest(tmp_path / "missing-folder", store)
    with pytest.raises(StoreError, match="no cagkit store"):
        Store.open(tmp_path / "nowhere")


def test_an_unknown_kv_dtype_is_refused_before_the_model_loads(docs, tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.import_module("cagkit.ingest.pipeline"), "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(StoreError, match="'float8'.*float16, bfloat16, float32"):
        _ingest(docs, tmp_path / "store", dtype="float8")
    assert not (tmp_path / "store").exists()


def test_question_against_an_empty_store(tiny_llama, docs, tmp_path):
    store = tmp_path / "store"
    _ingest(docs, store, prune=False)
    (docs / "bakery.txt").unlink()
    (docs / "lighthouse.md").unlink()
    (docs / "note.txt").write_text("placeholder")
    _ingest(docs, store, prune=True)
    with Store.open(store) as st:
        st.remove_document(str((docs / "note.txt").resolve()))
    with pytest.raises(StoreError, match="holds no documents.*cagkit ingest"):
        ask("anything?", store=store, model="tiny-llama")


def test_unknown_model_alias_is_a_clear_error(docs, tmp_path):
    from cagkit.errors import ModelError

    with pytest.raises(ModelError, match="unknown model 'gpt-9'.*smollm2, gemma, qwen"):
        ingest([docs], store=tmp_path / "store", source="gpt-9", progress=False)


def test_killed_ingest_leaves_a_usable_store(tiny_llama, docs, tmp_path):
    """SIGKILL in the middle of an ingest: the store opens, lists only complete documents, and a re-run finishes."""
    store = tmp_path / "store"
    for i in range(40):
        (docs / f"extra{i:02d}.txt").write_text(f"Document {i} says the number {i * 7} matters.\n\n" * 30)
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(os.path.dirname(os.path.dirname(__file__)))!r})
        import conftest
        from cagkit.models.loading import LoadedModel, register_loaded
        from transformers import AutoTokenizer
        from cagkit.models.registry import convert
        tok = AutoTokenizer.from_pretrained(convert("smollm2"))
        register_loaded("tiny-llama", LoadedModel("tiny-llama", conftest.make_tiny_llama(tok), tok, "tiny-llama-fp", True))
        from cagkit.ingest.pipeline import ingest
        print("start", flush=True)
        ingest([{str(docs)!r}], store={str(store)!r}, source="tiny-llama", chunk_tokens=32, progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "start"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with Store.open(store) as st:
                if len(st.documents()) >= 3:
                    break
        except StoreError:  # not created yet, or its settings not written yet
            pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with Store.open(store) as st:
        done = st.documents()
        assert 3 <= len(done) < 42
        for doc in done:
            assert st.is_intact(doc)
    report = _ingest(docs, store)
    assert len(report.unchanged) == len(done)
    with Store.open(store) as st:
        assert len(st.documents()) == 42
        assert all(st.is_intact(d) for d in st.documents())


def test_a_second_writer_is_refused_while_the_first_holds_the_store(tiny_llama, docs, tmp_path):
    from cagkit.store.store import StoreSettings

    settings = StoreSettings("tiny-llama", "tiny-llama-fp", "float16", 32, "all-MiniLM-L6-v2")
    with Store.open_for_writing(tmp_path / "store", settings):
        with pytest.raises(StoreError, match="being written by another cagkit ingest"):
            Store.open_for_writing(tmp_path / "store", settings)
    with Store.open_for_writing(tmp_path / "store", settings) as again:
        assert again.documents() == []


def test_a_waiting_writer_opens_the_store_once_the_first_is_done(tiny_llama, tmp_path, capsys):
    """What `cagkit eval` does: two runs over the same data share one store, and the second waits."""
    import threading
    import time

    from cagkit.store.store import StoreSettings

    settings = StoreSettings("tiny-llama", "tiny-llama-fp", "float16", 32, "all-MiniLM-L6-v2")
    opened = []

    def second():
        with Store.open_for_writing(tmp_path / "store", settings, wait=True) as st:
            opened.append(st.documents())

    with Store.open_for_writing(tmp_path / "store", settings):
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not opened  # still waiting while the first holds the store
    waiter.join(timeout=10)
    assert opened == [[]]
    assert "is being written by another cagkit process; waiting for it" in capsys.readouterr().err


def test_a_texts_embedding_does_not_depend_on_its_batch():
    """Texts are embedded in small length-sorted batches, padded to their longest text: padding must not leak."""
    from cagkit.retrieval.embeddings import EMBED_BATCH, embed

    texts = ["Owls hunt at night.", "The bakery on Mill Street " * 30, "Bread.", "A lighthouse keeper counted ships "
             "before the storm.", "Vienna", "Its oven was brought from Vienna in 1923 by the founder's grandson."]
    assert len(texts) > EMBED_BATCH  # more than one batch
    together = embed(texts)
    alone = np.concatenate([embed([t]) for t in texts])
    assert np.abs(together - alone).max() < 1e-5
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_ingest_keeps_sentence_embeddings_and_ask_embeds_them_where_a_chunk_lacks_them(tiny_llama, docs, tmp_path,
                                                                                        monkeypatch):
    import dataclasses

    from cagkit.kv.selection import chunk_sentences
    from cagkit.retrieval.embeddings import embed

    store = tmp_path / "store"
    _ingest(docs, store)
    with Store.open(store) as st:
        doc = st.document(str((docs / "bakery.txt").resolve()))
        chunk = st.load_chunk(st.chunk_ids(doc.path)[1])
    spans, vectors = chunk.sentences
    assert [chunk.text[a:b].strip() for a, b in spans.tolist()] == [
        "Its oven was brought from Vienna in 1923 by the founder's grandson, a baker named Josef Weber."]
    np_close = float(vectors[0] @ embed([chunk.text[spans[0, 0]:spans[0, 1]]])[0])
    assert np_close > 0.999  # the stored vector is that sentence's embedding (fp16)
    # A chunk stored without sentences (a store written without the embedder): ask-time code embeds them ...
    bare = dataclasses.replace(chunk, sentences=None)
    (spans2, vectors2), = chunk_sentences([bare.text], [bare.sentences])
    assert spans2.tolist() == spans.tolist()
    assert float(vectors2[0] @ vectors[0]) > 0.999
    # ... and only once per process: the next question that retrieves the chunk reuses them
    calls = []
    with monkeypatch.context() as patch:
        patch.setattr(importlib.import_module("cagkit.kv.selection"), "embed_sentences", calls.append)
        (spans3, _), = chunk_sentences([bare.text], [bare.sentences])
    assert calls == [] and spans3.tolist() == spans.tolist()


def test_store_summary_and_remove(tiny_llama, docs, tmp_path, capsys):
    from cagkit.cli import main
    from cagkit.ingest.pipeline import remove

    store = tmp_path / "store"
    _ingest(docs, store)
    bakery, lighthouse = str((docs / "bakery.txt").resolve()), str((docs / "lighthouse.md").resolve())
    with Store.open(store) as st:
        info = st.summary()
        kv_file = store / "kv" / st.document(bakery).kv_file
    assert (info["documents"], info["chunks"], info["settings"]["source"]) == (2, 4, "tiny-llama")
    assert [(d["path"], d["chunks"], d["state"]) for d in info["per_document"]] == [(bakery, 2, "ok"),
                                                                                    (lighthouse, 2, "ok")]
    assert info["per_document"][0]["kv_bytes"] == kv_file.stat().st_size
    assert info["tokens"] == sum(d["tokens"] for d in info["per_document"]) > 0
    # a damaged file: the summary says which needs re-ingesting
    kv_file.write_bytes(kv_file.read_bytes()[:100])
    capsys.readouterr()
    assert main(["store", "info", "--store", str(store)]) == 1  # a damaged store is not a healthy exit
    out = capsys.readouterr().out
    assert "2 documents, 4 chunks" in out and "damaged" in out and "1 of 2 documents are damaged" in out
    assert "cagkit store repair" in out
    assert main(["store", "info", "--store", str(store), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["per_document"][0]["state"] == "damaged"

    # a path that matches nothing removes nothing and names itself
    with pytest.raises(CagkitError, match=r"no document in store .* lies under .*nowhere\.md.*cagkit store info"):
        remove([docs / "lighthouse.md", docs / "nowhere.md"], store=store)
    with Store.open(store) as st:
        assert len(st.documents()) == 2
    assert remove([docs / "lighthouse.md"], store=store) == [lighthouse]
    with Store.open(store) as st:
        assert [d.path for d in st.documents()] == [bakery] and st.num_chunks() == 2
        assert retrieve(st, "lighthouse", top_k=4)[0].doc_path == bakery
    assert main(["store", "remove", str(docs), "--store", str(store)]) == 0  # a folder drops all under it
    assert "1 document removed" in capsys.readouterr().out
    with Store.open(store) as st:
        assert st.documents() == [] and list((store / "kv").iterdir()) == []
