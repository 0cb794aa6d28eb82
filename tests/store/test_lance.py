"""The LanceDB store (issue 33), on local disk and on an S3-compatible server: the same answers as the SQLite
store, readers in other processes, several writers at once, nothing half-committed, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

pytest.importorskip("lancedb")

from conftest import ingest_docs as _ingest  # noqa: E402
from s3server import fake_chunks, settings_for  # noqa: E402

from cagkit.ask import ask  # noqa: E402
from cagkit.errors import StoreError  # noqa: E402
from cagkit.ingest.pipeline import remove  # noqa: E402
from cagkit.retrieval.search import retrieve  # noqa: E402
from cagkit.store import lance  # noqa: E402
from cagkit.store.store import Store  # noqa: E402

QUESTIONS = ["Who built the lighthouse on Kerrow Point?", "Where was the bakery's oven brought from?",
             "How tall is it?", "rye bread Tuesday"]


def test_a_lance_store_answers_as_the_sqlite_store_does(tiny_llama, docs, tmp_path):
    _ingest(docs, tmp_path / "sqlite")
    report = _ingest(docs, tmp_path / "lance", manifest="lance")
    assert len(report.added) == 2 and report.chunks == 4
    assert lance.is_lance_store(tmp_path / "lance") and not lance.is_lance_store(tmp_path / "sqlite")
    with Store.open(tmp_path / "sqlite") as a, Store.open(tmp_path / "lance") as b:
        assert isinstance(b, lance.LanceStore)
        assert [(d.path, d.sha256, d.n_chunks, d.n_tokens) for d in a.documents()] == \
               [(d.path, d.sha256, d.n_chunks, d.n_tokens) for d in b.documents()]
        for question in QUESTIONS:
            for mode in ("dense", "lexical", "hybrid"):
                ha, hb = retrieve(a, question, 3, mode), retrieve(b, question, 3, mode)
                if mode == "dense":  # an exact scan in both
                    assert [(h.doc_path, h.idx) for h in ha] == [(h.doc_path, h.idx) for h in hb], question
                    np.testing.assert_allclose([h.score for h in ha], [h.score for h in hb], rtol=1e-4, atol=1e-5)
                elif mode == "lexical":  # LanceDB's BM25 stems words and lists only chunks that share one
                    shared = [(h.doc_path, h.idx) for h in ha if h.score > 0]
                    assert [(h.doc_path, h.idx) for h in hb] == shared, question
                else:
                    assert (hb[0].doc_path, hb[0].idx) == (ha[0].doc_path, ha[0].idx), question
                paths = [d.path for d in a.documents()][:1]  # a few documents: ranked exactly as Store ranks
                ha = a.search(np.asarray(_embed(question)), 2, question, mode, documents=paths)
                hb = b.search(np.asarray(_embed(question)), 2, question, mode, documents=paths)
                assert [(h.doc_path, h.idx, round(h.score, 5)) for h in ha] == \
                       [(h.doc_path, h.idx, round(h.score, 5)) for h in hb]
        for doc in a.documents():
            for ia, ib in zip(a.chunk_ids(doc.path), b.chunk_ids(doc.path), strict=True):
                ca, cb = a.load_chunk(ia), b.load_chunk(ib)
                assert (ca.text, ca.token_ids) == (cb.text, cb.token_ids)
                torch.testing.assert_close(ca.kv.keys, cb.kv.keys)
                np.testing.assert_array_equal(ca.sentences[0], cb.sentences[0])
        assert b.verify()["ok"]
    answers = [ask(QUESTIONS[0], store=tmp_path / s, model="tiny-llama", max_new_tokens=4).answer
               for s in ("sqlite", "lance")]
    assert answers[0] == answers[1]


def _embed(text):
    from cagkit.retrieval.embeddings import embed_query

    return embed_query(text)


# A document of about 700 tokens: with chunks of 32 tokens and a window of 200, it is read in parts of 84 tokens
# at most, and slides past the window.
HARBOUR = " ".join(f"Sentence {i} tells of harbour town {i} and its {i * 3} boats." for i in range(40))
WINDOW = 200


def test_a_document_read_whole_is_stored_in_lance_as_in_sqlite(tiny_llama, docs, tmp_path):
    (docs / "harbour.txt").write_text(HARBOUR)
    _ingest(docs, tmp_path / "sqlite", window=WINDOW)
    report = _ingest(docs, tmp_path / "lance", manifest="lance", window=WINDOW)
    assert len(report.added) == 3
    with Store.open(tmp_path / "sqlite") as a, Store.open(tmp_path / "lance") as b:
        assert [(d.path, d.n_chunks, d.n_tokens, d.prefill, d.window) for d in a.documents()] == \
               [(d.path, d.n_chunks, d.n_tokens, d.prefill, d.window) for d in b.documents()]
        assert {d.prefill for d in b.documents()} == {"document"} and {d.window for d in b.documents()} == {WINDOW}
        info_a, info_b = a.summary()["per_document"], b.summary()["per_document"]
        assert [(d["path"], d["prefill"], d["window"]) for d in info_a] == \
               [(d["path"], d["prefill"], d["window"]) for d in info_b]
        harbour = b.document(str((docs / "harbour.txt").resolve()))
        assert len(b.kv_files(harbour)) > 3  # several parts: the window slid
        for doc in a.documents():
            ids_a, ids_b = a.chunk_ids(doc.path), b.chunk_ids(doc.path)
            assert len(ids_a) == len(ids_b)
            for ca, cb in zip(a.load_chunks(ids_a), b.load_chunks(ids_b)):
                assert cb.context is not None and (ca.token_ids, ca.context) == (cb.token_ids, cb.context)
                torch.testing.assert_close(ca.kv.keys, cb.kv.keys, rtol=0, atol=0)
                torch.testing.assert_close(ca.kv.values, cb.kv.values, rtol=0, atol=0)
        assert b.verify()["ok"]
    # the same documents with each chunk prefilled alone: recorded so, and never named as the document's KV
    _ingest(docs, tmp_path / "alone", manifest="lance", prefill="chunks")
    with Store.open(tmp_path / "lance") as whole, Store.open(tmp_path / "alone") as alone:
        assert {(d.prefill, d.window) for d in alone.documents()} == {("chunks", None)}
        assert all(c.context is None for d in alone.documents() for c in alone.load_chunks(alone.chunk_ids(d.path)))
        assert alone.summary()["per_document"][0]["prefill"] == "chunks"
        names = {f for d in whole.documents() for f in whole.kv_files(d)}
        assert names and not names & {f for d in alone.documents() for f in alone.kv_files(d)}


def _drop_added_columns(store):
    """Make the manifest's table what a cagkit before document caches wrote: without doc_prefill and doc_window."""
    import lancedb

    table = lancedb.connect(str(store / lance.MANIFEST)).open_table(lance.TABLE)
    table.drop_columns(["doc_prefill", "doc_window"])
    assert "doc_prefill" not in table.schema.names


def _columns(store):
    import lancedb

    return lancedb.connect(str(store / lance.MANIFEST)).open_table(lance.TABLE).schema.names


def test_a_lance_table_written_before_document_caches_is_read_as_chunks_and_takes_new_documents(tmp_path):
    store = tmp_path / "s"
    old_chunks, old_vectors = fake_chunks("one two three. four five.", seed=1)
    with Store.open_for_writing(store, settings_for("fp"), manifest="lance") as st:
        st.write_document("old", "a" * 64, old_chunks, old_vectors)
    _drop_added_columns(store)
    with Store.open(store) as st:  # a reader reads it as it is, and changes nothing
        (doc,) = st.documents()
        assert (doc.prefill, doc.window) == ("chunks", None) and st.document("old").prefill == "chunks"
        assert st.summary()["per_document"][0]["prefill"] == "chunks" and st.verify()["ok"]
        assert st.load_chunk(st.chunk_ids("old")[0]).context is None
    assert "doc_prefill" not in _columns(store)
    new_chunks, new_vectors = fake_chunks("six seven. eight nine ten.", seed=2)
    for at, chunk in enumerate(new_chunks):
        chunk.context = (at * 10, 3, 64, 4)
    with Store.open_for_writing(store, settings_for("fp")) as st:  # a writer adds the columns as it opens the table
        assert {"doc_prefill", "doc_window"} <= set(_columns(store))
        _drop_added_columns(store)  # and again as it commits, should the table lack them by then
        st.write_document("new", "b" * 64, new_chunks, new_vectors)
    assert {"doc_prefill", "doc_window"} <= set(_columns(store))
    with Store.open(store) as st:
        assert [(d.path, d.prefill, d.window) for d in st.documents()] == [("new", "document", 64),
                                                                           ("old", "chunks", None)]
        assert [st.load_chunk(i).context for i in st.chunk_ids("new")] == [c.context for c in new_chunks]
        assert st.verify()["ok"]


def test_a_lance_store_is_incremental_and_replaces_a_document_whole(tiny_llama, docs, tmp_path):
    store = tmp_path / "lance"
    _ingest(docs, store, manifest="lance")
    again = _ingest(docs, store)  # an existing LanceDB store is found as such without saying so
    assert len(again.unchanged) == 2 and not again.added
    (docs / "bakery.txt").write_text("The bakery closed in 2019.")
    changed = _ingest(docs, store)
    assert [os.path.basename(p) for p in changed.updated] == ["bakery.txt"]
    with Store.open(store) as st:
        bakery = st.document(str((docs / "bakery.txt").resolve()))
        assert bakery.n_chunks == 1 and st.num_chunks() == 3  # the older version's second chunk is gone
        assert st.load_chunk(st.chunk_ids(bakery.path)[0]).text == "The bakery closed in 2019."
        found = st.verify()
        assert found["ok"] and len(found["orphans"]) == 1  # the older version's file, kept for the grace period
    with lance.LanceStore.open_for_writing(store, _settings(store), orphan_grace_s=0) as st:
        assert len(st.removed) == 1
    remove([docs / "bakery.txt"], store=store)
    with Store.open(store) as st:
        assert [os.path.basename(d.path) for d in st.documents()] == ["lighthouse.md"]


def _settings(store):
    with Store.open(store) as st:
        return st.settings


def test_kv_file_names_are_content_hashes_the_same_in_every_process():
    settings = settings_for("fp")
    name = lance.kv_file_name(settings, 0, [[1, 2, 3], [4]])
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from cagkit.store import lance; "
            "from s3server import settings_for; print(lance.kv_file_name(settings_for('fp'), 0, [[1, 2, 3], [4]]))")
    other = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.dirname(__file__))],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"}).stdout.strip()
    assert other == name and len(name) == len("0" * 64 + ".safetensors")
    assert lance.kv_file_name(settings, 1, [[1, 2, 3], [4]]) != name
    assert lance.kv_file_name(settings_for("other"), 0, [[1, 2, 3], [4]]) != name
    # chunks prefilled in their document are named by their context and the part before too; alone, by neither
    assert lance.kv_file_name(settings, 0, [[1, 2, 3], [4]], [None, None], before="x") == name
    read = lance.kv_file_name(settings, 0, [[1, 2, 3], [4]], [(0, 5, 100, 4), (3, 5, 100, 4)])
    assert read != name
    assert lance.kv_file_name(settings, 0, [[1, 2, 3], [4]], [(0, 5, 200, 4), (3, 5, 200, 4)]) != read
    after = lance.kv_file_name(settings, 0, [[1, 2, 3], [4]], [(0, 5, 100, 4), (3, 5, 100, 4)], before=read)
    assert after not in (read, name)


def test_a_part_read_in_its_document_is_named_by_what_was_read_before_it(tmp_path):
    """Two documents whose second parts hold the same tokens at the same places: read alone, the part is the same
    KV and one file serves both; read in its document, it attended to a different first part, so it is another."""
    def write(st, path, seed, context):
        first, vectors = fake_chunks("one two three. four five.", seed=seed)
        second, more = fake_chunks("six seven. eight nine ten.", seed=7)
        for at, chunk in enumerate(first + second):
            chunk.context = (at * 3, 2, 64, 4) if context else None
        with st.document_writer(path, path.ljust(64, "0")) as writer:
            writer.add(first, vectors)
            writer.add(second, more)
            writer.commit()
        return st.kv_files(st.document(path))

    with Store.open_for_writing(tmp_path / "s", settings_for("fp"), manifest="lance") as st:
        a, b = write(st, "a", 1, False), write(st, "b", 2, False)
        assert a[0] != b[0] and a[1] == b[1]
        a, b = write(st, "c", 1, True), write(st, "d", 2, True)
        assert a[0] != b[0] and a[1] != b[1]
        assert st.verify()["ok"]


# -- on an S3-compatible server ------------------------------------------------------------------------------

def test_a_store_on_s3_written_by_one_process_is_read_by_another(tiny_llama, docs, s3):
    url = s3.bucket_url("shared") + "/store"
    report = _ingest(docs, url)
    assert len(report.added) == 2
    code = textwrap.dedent(f"""
        import json
        from cagkit.retrieval.search import retrieve
        from cagkit.store.store import Store
        with Store.open({url!r}) as st:
            hits = retrieve(st, {QUESTIONS[0]!r}, 2, "hybrid")
            chunk = st.load_chunk(hits[0].chunk_id)
            print(json.dumps({{"docs": len(st.documents()), "ok": st.verify()["ok"], "top": hits[0].text,
                              "tokens": len(chunk.token_ids), "layers": chunk.kv.keys.shape[0],
                              "prefill": sorted({{d.prefill for d in st.documents()}}), "context": chunk.context}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=s3.env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["docs"] == 2 and seen["ok"] and "Mara Ellison" in seen["top"] and seen["layers"] == 2
    assert seen["prefill"] == ["document"] and seen["context"] is not None  # ingest reads a document whole
    with Store.open(url) as st:
        found = st.verify()
        assert found["ok"] and not found["orphans"] and not found["missing"]
    answer = ask(QUESTIONS[0], store=url, model="tiny-llama", max_new_tokens=3)
    assert answer.sources and not answer.skipped


def test_two_writers_at_once_on_s3_both_land(s3):
    url = s3.bucket_url("writers") + "/store"
    code = textwrap.dedent("""
        import sys
        from cagkit.store.store import Store
        from s3server import fake_chunks, settings_for
        who = sys.argv[1]
        with Store.open_for_writing(sys.argv[2], settings_for("fp")) as st:
            for n in range(4):
                chunks, vectors = fake_chunks(f"{who} document {n}", seed=hash(who) % 1000 + n)
                st.write_document(f"{who}-{n}", f"{who}{n}".ljust(64, "0"), chunks, vectors)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, who, url], env=s3.env, stderr=subprocess.PIPE,
                              text=True) for who in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()[-2000:]
    with Store.open(url) as st:
        assert sorted(d.path for d in st.documents()) == [f"{w}-{n}" for w in "ab" for n in range(4)]
        found = st.verify()
        assert found["ok"] and not found["orphans"] and not found["missing"]


def test_a_creation_of_the_table_that_overwrote_another_writers_rows_puts_them_back(tmp_path, monkeypatch):
    """Two writers that find no table can both create it, and Lance commits the later creation as an overwrite of
    what is there (two threads racing: 5 times in 30). Here the second writer looked before the first created the
    table, and its creation lands after the first committed and read back its document: that document stays."""
    store = tmp_path / "s"
    with Store.open_for_writing(store, settings_for("fp"), manifest="lance") as first, \
            Store.open_for_writing(store, settings_for("fp"), manifest="lance") as second:
        first.write_document("first", "a" * 64, *fake_chunks("one two three. four five.", seed=1))
        db = second._connect()

        class Racing:  # the creation as Lance commits it in such a race: over whatever is there
            def __getattr__(self, name):
                return getattr(db, name)

            def create_table(self, name, **options):
                return db.create_table(name, **{**options, "mode": "overwrite"})

        second._db, second._table = Racing(), None
        with monkeypatch.context() as patched:
            patched.setattr(lance, "_open_table", lambda loc: None)  # it found no table
            second.write_document("second", "b" * 64, *fake_chunks("six seven. eight nine ten.", seed=2))
    with Store.open(store) as st:
        assert [d.path for d in st.documents()] == ["first", "second"]
        assert st.verify()["ok"] and len(st.chunk_ids("first")) == len(fake_chunks("one two three. four five.", 1)[0])


def test_an_unreachable_store_is_a_one_line_error_not_a_hang(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the discard port: nothing answers
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    started = time.monotonic()
    with pytest.raises(StoreError) as err:
        Store.open("s3://nowhere/store")
    assert time.monotonic() - started < 120
    message = str(err.value)
    assert "\n" not in message and "s3://nowhere/store" in message and "AWS_ENDPOINT_URL" in message


def test_an_endpoint_that_never_answers_fails_within_timeout_times_attempts(tmp_path):
    """An S3 endpoint that accepts connections and never replies: `store info` fails with its one-line error after
    the configured attempts of the configured timeout each, not after s3fs's retries of botocore's retries."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    requests, held = [], []

    def take(conn):
        held.append(conn)  # kept open, never answered
        data = conn.recv(65536)
        if data:
            requests.append(data.split(b"\r\n", 1)[0].decode())

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed at the end of the test
                return
            threading.Thread(target=take, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.getsockname()[1]}", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1", "CAGKIT_S3_TIMEOUT": "1",
           "CAGKIT_S3_ATTEMPTS": "2"}
    code = "import sys; from cagkit.cli import main; sys.exit(main())"
    try:
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-c", code, "store", "info", "--store", "s3://silent/store"],
                             capture_output=True, text=True, env=env, timeout=120)
        elapsed = time.monotonic() - started
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-2000:]
    assert "s3://silent/store" in out.stderr and "timeout" in out.stderr.lower()
    assert len(requests) == 2, requests  # CAGKIT_S3_ATTEMPTS in all: no retries wrapped around the attempts
    assert elapsed < 30  # 2 attempts of 1 s, a start and a backoff; it was 20 requests of 30 s


@pytest.mark.parametrize("name, value", [("CAGKIT_S3_TIMEOUT", "soon"), ("CAGKIT_S3_ATTEMPTS", "0")])
def test_a_bad_s3_limit_in_the_environment_is_a_one_line_error(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(StoreError, match=rf"{name}='{value}' is not a positive .*unset it"):
        Store.open("s3://bucket/store")


def test_a_missing_bucket_is_named_as_missing(s3, capsys):
    from cagkit.cli import main

    s3.bucket_url("there")  # another bucket exists: the endpoint answers
    with pytest.raises(StoreError, match=r"bucket no-such-bucket of store s3://no-such-bucket/store does not exist"):
        Store.open("s3://no-such-bucket/store")
    assert main(["store", "info", "--store", "s3://no-such-bucket/store"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err and "create one with" not in err
    with pytest.raises(StoreError, match="no cagkit store at s3://there/store"):  # a bucket without a store
        Store.open("s3://there/store")


def test_store_migrate_copies_a_sqlite_store_to_s3_as_stored(tiny_llama, docs, tmp_path, s3, capsys):
    from cagkit.cli import main

    _ingest(docs, tmp_path / "sqlite")
    url = s3.bucket_url("migrated") + "/store"
    assert main(["store", "migrate", "--store", str(tmp_path / "sqlite"), "--to", url]) == 0
    assert "2 copied, 0 there already, 0 left out" in capsys.readouterr().out
    with Store.open(tmp_path / "sqlite") as a, Store.open(url) as b:
        assert isinstance(b, lance.LanceStore) and b.settings == a.settings and b.verify()["ok"]
        for doc in a.documents():
            copied = b.document(doc.path)
            assert copied.sha256 == doc.sha256 and (copied.prefill, copied.window) == (doc.prefill, doc.window)
            assert doc.prefill == "document"
            for ia, ib in zip(a.chunk_ids(doc.path), b.chunk_ids(doc.path), strict=True):
                ca, cb = a.load_chunk(ia), b.load_chunk(ib)
                assert (ca.text, ca.token_ids, ca.idx, ca.context) == (cb.text, cb.token_ids, cb.idx, cb.context)
                torch.testing.assert_close(ca.kv.values, cb.kv.values, rtol=0, atol=0)
        q = _embed(QUESTIONS[1])
        assert [(h.doc_path, h.idx) for h in a.search(q, 2)] == [(h.doc_path, h.idx) for h in b.search(q, 2)]
    # damage one document of the source: the next migrate leaves it out, names it, and exits 1
    (docs / "bakery.txt").write_text("The bakery closed in 2019.")
    _ingest(docs, tmp_path / "sqlite")
    with Store.open(tmp_path / "sqlite") as a:
        bakery = a.document(str((docs / "bakery.txt").resolve()))
        (tmp_path / "sqlite" / "kv" / a.kv_files(bakery)[0]).write_bytes(b"broken")
    assert main(["store", "migrate", "--store", str(tmp_path / "sqlite"), "--to", url]) == 1
    captured = capsys.readouterr()
    assert "0 copied, 1 there already, 1 left out" in captured.out and "bakery.txt" in captured.err
    with Store.open(url) as b:  # the copy keeps the older bakery rather than losing it
        assert b.document(bakery.path).sha256 != bakery.sha256 and b.verify()["ok"]


def test_store_migrate_dtype_compresses_a_store_without_prefilling_again(tiny_llama, docs, tmp_path, capsys):
    from cagkit.cli import main
    from cagkit.kv import quant

    _ingest(docs, tmp_path / "sqlite")
    copy = tmp_path / "int8"
    assert main(["store", "migrate", "--store", str(tmp_path / "sqlite"), "--to", str(copy), "--dtype", "int8"]) == 0
    assert "2 copied" in capsys.readouterr().out
    with Store.open(tmp_path / "sqlite") as a, Store.open(copy) as b:
        assert b.settings.dtype == "int8" and a.settings.dtype == "float16" and b.verify()["ok"]
        assert b.summary()["bytes"] < a.summary()["bytes"]
        for doc in a.documents():
            for ia, ib in zip(a.chunk_ids(doc.path), b.chunk_ids(doc.path), strict=True):
                ca, cb = a.load_chunk(ia), b.load_chunk(ib)
                assert ca.token_ids == cb.token_ids
                # exactly what int8 makes of the stored KV: the copy quantizes the KV as stored
                keys, values = quant.dequantize(quant.quantize(ca.kv.keys, ca.kv.values, "int8"))
                torch.testing.assert_close(cb.kv.keys.float(), keys.float(), rtol=0, atol=1e-3)
                torch.testing.assert_close(cb.kv.values.float(), values.float(), rtol=0, atol=1e-3)
    # a copy again resumes: every document is there already
    assert main(["store", "migrate", "--store", str(tmp_path / "sqlite"), "--to", str(copy), "--dtype", "int8"]) == 0
    assert "0 copied, 2 there already" in capsys.readouterr().out
    # more bytes for no more precision is refused, naming the store and the fix; nothing is written
    _ingest(docs, tmp_path / "sqlite4", dtype="int4")
    assert main(["store", "migrate", "--store", str(tmp_path / "sqlite4"), "--to", str(tmp_path / "up"),
                 "--dtype", "int8"]) == 2
    err = capsys.readouterr().err
    assert "holds its KV in int4" in err and "--dtype int8" in err and not (tmp_path / "up").exists()


def test_ingest_manifest_lance_on_the_command_line(tiny_llama, docs, tmp_path, capsys):
    from cagkit.cli import main

    store = tmp_path / "lance"
    assert main(["ingest", str(docs), "--store", str(store), "--source", "tiny-llama", "--chunk-tokens", "32",
                 "--manifest", "lance", "--quiet"]) == 0
    assert lance.is_lance_store(store)
    assert main(["store", "info", "--store", str(store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["documents"] == 2 and info["chunks"] == 4 and info["bytes"] > 0
    assert main(["store", "verify", "--store", str(store)]) == 0


def test_the_servers_store_reader_serves_a_lance_store(tiny_llama, docs, tmp_path):
    from cagkit.serve.store import StoreReader

    reader = StoreReader(tmp_path / "lance")
    assert reader.version() is None
    _ingest(docs, tmp_path / "lance", manifest="lance")
    assert reader.version() is not None
    store = reader.current()
    assert isinstance(store, lance.LanceStore) and len(store.documents()) == 2 and reader.disk_bytes() > 0
    (docs / "garden.md").write_text("The walled garden holds four hundred roses.")
    _ingest(docs, tmp_path / "lance")  # another process's commit: the open store sees it at the next search
    assert len(reader.current().documents()) == 3


def test_a_damaged_file_is_rewritten_not_reused_by_the_next_writer(tmp_path):
    store = tmp_path / "s"
    chunks, vectors = fake_chunks("one two three. four five.", seed=1)
    with Store.open_for_writing(store, settings_for("fp"), manifest="lance") as st:
        st.write_document("doc", "a" * 64, chunks, vectors)
        name = st.kv_files(st.document("doc"))[0]
    file = store / "kv" / name
    data = bytearray(file.read_bytes())
    data[-8:] = bytes(8)  # changed tensor bytes, header intact
    file.write_bytes(bytes(data))
    with Store.open(store) as st:
        assert st.verify()["damaged"] == ["doc"]
    with Store.open_for_writing(store, settings_for("fp")) as st:  # the same document again: the same file name
        st.write_document("doc", "a" * 64, chunks, vectors)
        assert st.kv_files(st.document("doc")) == [name]
    with Store.open(store) as st:
        assert st.verify()["ok"]
        torch.testing.assert_close(st.load_chunk(st.chunk_ids("doc")[-1]).kv.values, chunks[-1].kv.values.half())


def test_above_the_threshold_a_vector_index_is_built_and_searched(tmp_path, monkeypatch):
    monkeypatch.setattr(lance, "VECTOR_INDEX_ROWS", 300)
    store = tmp_path / "s"
    rng = np.random.default_rng(0)
    with Store.open_for_writing(store, settings_for("fp", dim=48), manifest="lance") as st:
        for n in range(40):
            text = ". ".join(f"document {n} sentence {i} " + " ".join(f"w{rng.integers(1000)}" for _ in range(3))
                             for i in range(8)) + "."
            chunks, vectors = fake_chunks(text, seed=n, dim=48)
            st.write_document(f"doc{n}", f"{n}".ljust(64, "0"), chunks, vectors)
    with Store.open(store) as st:
        assert st.num_chunks() == 320
        assert "vector_idx" in {i.name for i in st._fresh().list_indices()}
        target = st.load_chunk(st.chunk_ids("doc7")[3])
        query = np.asarray(st._rows(["vector"], "doc_path = 'doc7' AND idx = 3").column("vector")[0].as_py())
        hits = st.search(query, 5)
        assert (hits[0].doc_path, hits[0].idx) == ("doc7", 3) and hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert target.text == hits[0].text


def test_a_kv_file_reads_the_same_from_a_remote_filesystem(tmp_path):
    """A remote file's chunk is fetched as merged byte ranges in one batch: the same tensors and checksums as a
    local read, for every chunk of a file of several (fsspec's memory filesystem stands in for S3)."""
    import fsspec
    from safetensors.torch import save

    from cagkit.store.kvfile import DamagedFile, KVFile

    tensors = {}
    for i in range(3):
        tensors[f"{i}.keys"] = torch.randn(2, 5 + i, 1, 4).half()
        tensors[f"{i}.values"] = torch.randn(2, 5 + i, 1, 4).half()
        tensors[f"{i}.token_ids"] = torch.arange(5 + i, dtype=torch.int32)
        tensors[f"{i}.offsets"] = torch.zeros(5 + i, 2, dtype=torch.int32)
    data = save(tensors)
    (tmp_path / "f.safetensors").write_bytes(data)
    memory = fsspec.filesystem("memory")
    memory.pipe_file("/kv/f.safetensors", data)
    local, remote = KVFile(tmp_path / "f.safetensors"), KVFile("/kv/f.safetensors", memory)
    for i in range(3):
        (a, sum_a), (b, sum_b) = local.read_chunk(i), remote.read_chunk(i)
        assert sum_a == sum_b and a.keys() == b.keys()
        assert all(bytes(a[n][2]) == bytes(b[n][2]) for n in a)
    memory.pipe_file("/kv/short.safetensors", data[:-40])  # cut short: the last tensor is found damaged
    with pytest.raises(DamagedFile):
        KVFile("/kv/short.safetensors", memory).read_chunk(2)


def test_a_documents_chunks_in_one_remote_file_are_one_batch_of_ranges(tmp_path, monkeypatch):
    """A document's chunks are fetched per KV file: one header request and one batch of byte ranges for all of
    them, the same tensors and checksums as reading each chunk alone."""
    import fsspec

    from cagkit.store.kvfile import KVFile

    store = tmp_path / "s"
    with Store.open_for_writing(store, settings_for("fp"), manifest="lance") as st:
        st.write_document("a", "a" * 64, *fake_chunks("one two three. four five. six. seven eight.", seed=1))
        (kv_file,) = st.kv_files(st.document("a"))
    memory = fsspec.filesystem("memory")
    memory.pipe_file("/kv/f.safetensors", (store / "kv" / kv_file).read_bytes())
    remote = KVFile("/kv/f.safetensors", memory)  # the header: one request
    batches = []
    real = memory.cat_ranges
    monkeypatch.setattr(memory, "cat_ranges", lambda paths, *a, **k: batches.append(len(paths)) or real(paths, *a, **k))
    together = remote.read_chunks(range(4))
    assert batches == [1]  # one batch, of one range: the four chunks' tensors lie side by side
    alone = KVFile(store / "kv" / kv_file)
    for i in range(4):
        tensors, checksum = alone.read_chunk(i)
        assert together[i][1] == checksum
        assert all(bytes(together[i][0][n][2]) == bytes(tensors[n][2]) for n in tensors)
