"""Durability of the store (issue 31): nothing lost, nothing deleted that cagkit did not write, damage found by
checksums and repaired, one-line errors, and long documents written in parts as they are prefilled."""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import sys
import threading
import time

import numpy as np
import pytest
import torch

from cagkit.cli import main
from cagkit.errors import CagkitError, StoreError
from cagkit.ingest.pipeline import ingest, ingest_texts, remove
from cagkit.store.store import Store

pipeline = importlib.import_module("cagkit.ingest.pipeline")

ORLIMAR = "The Orlimar lighthouse flashes green every nine seconds."
REPAINTED = "The Orlimar lighthouse was repainted red in 2020."
FERRY = ("The ferry to Inish Mor leaves at nine. It returns at six in summer.\n\n"
         "Tickets cost twelve euro. Bicycles travel free on weekdays.")


def _ingest(paths, store, **kw):
    return ingest(paths if isinstance(paths, list) else [paths], store=store, source="tiny-llama", chunk_tokens=32,
                  progress=False, **kw)


def _cli(*argv) -> int:
    return main([*map(str, argv)])


def _ferry_store(dup, tmp_path):
    """A store of the `dup` folder with y.txt made two paragraphs (several chunks), and y.txt's path in it."""
    store = tmp_path / "s"
    (dup / "y.txt").write_text(FERRY)
    _ingest(dup, store)
    return store, str((dup / "y.txt").resolve())


def _damage_tensor_bytes(file, offset_from_end: int = 64, count: int = 16) -> None:
    """Overwrite bytes of a KV file's tensor data, its header left intact (what the issue's probe did)."""
    data = bytearray(file.read_bytes())
    data[-offset_from_end:-offset_from_end + count] = os.urandom(count)
    file.write_bytes(bytes(data))


@pytest.fixture
def dup(tmp_path):
    folder = tmp_path / "dup"
    folder.mkdir()
    (folder / "x.txt").write_text(ORLIMAR + "\n")
    (folder / "y.txt").write_text(ORLIMAR + "\n")
    return folder


# -- 1a: two documents with the same text -------------------------------------------------------------------

def test_editing_one_of_two_identical_documents_keeps_the_other(tiny_llama, dup, tmp_path, manifest):
    store = tmp_path / "s"
    _ingest(dup, store, manifest=manifest)
    (dup / "x.txt").write_text(REPAINTED + "\n")
    report = _ingest(dup, store)
    assert [os.path.basename(p) for p in report.updated] == ["x.txt"]
    with Store.open(store) as st:
        y = st.document(str((dup / "y.txt").resolve()))
        assert st.load_chunk(st.chunk_ids(y.path)[0]).text == ORLIMAR
        assert st.is_intact(y, checksums=True)
        assert st.verify()["ok"]
    remove([dup / "x.txt"], store=store)  # removing one of the two keeps the other's KV too
    with Store.open(store) as st:
        assert st.load_chunk(st.chunk_ids(y.path)[0]).text == ORLIMAR


# -- 1b: cagkit never deletes a file it did not write ----------------------------------------------------------

def test_a_folder_that_is_not_a_store_is_refused_and_keeps_its_files(tiny_llama, dup, tmp_path, manifest):
    mine = tmp_path / "mine"
    (mine / "kv").mkdir(parents=True)
    (mine / "kv" / "notes.txt").write_text("notes")
    with pytest.raises(StoreError, match=rf"{mine} is not empty and is not a cagkit store"):
        _ingest(dup, mine, manifest=manifest)
    assert (mine / "kv" / "notes.txt").read_text() == "notes"
    (mine / "kv" / "notes.txt").unlink()
    (mine / "todo.md").write_text("mine")
    assert _cli("ingest", dup, "--store", mine, "--source", "tiny-llama", "--quiet", "--manifest", manifest) == 2
    assert (mine / "todo.md").read_text() == "mine"
    assert sorted(p.name for p in mine.iterdir()) == ["kv", "todo.md"] and not any((mine / "kv").iterdir())


def test_files_in_a_store_that_cagkit_did_not_write_are_left_alone(tiny_llama, dup, tmp_path, capsys, manifest):
    store = tmp_path / "s"
    _ingest(dup, store, manifest=manifest)
    (store / "kv" / "notes.txt").write_text("notes")
    (store / "kv" / "0123456789abcdef01234567.safetensors").write_bytes(b"not cagkit's")
    (dup / "x.txt").write_text(REPAINTED + "\n")
    _ingest(dup, store)
    with Store.open(store) as st:
        found = st.verify()
    assert (store / "kv" / "notes.txt").read_text() == "notes"
    assert (store / "kv" / "0123456789abcdef01234567.safetensors").exists()
    assert found["ok"] and found["foreign"] == ["0123456789abcdef01234567.safetensors", "notes.txt"]


def test_a_file_given_as_store_is_a_one_line_error(tiny_llama, dup, tmp_path, capsys, manifest):
    file = tmp_path / "store.txt"
    file.write_text("a file")
    with pytest.raises(StoreError, match="is a file"):
        _ingest(dup, file, manifest=manifest)
    assert _cli("store", "info", "--store", file) == 2
    assert "is a file" in capsys.readouterr().err
    assert file.read_text() == "a file"


# -- 2: checksums --------------------------------------------------------------------------------------------

def test_changed_tensor_bytes_are_found_named_and_rebuilt(tiny_llama, dup, tmp_path, capsys, manifest):
    from cagkit.store.store import DamagedChunkError

    store = tmp_path / "s"
    (dup / "y.txt").write_text(FERRY)  # not x's text, whose KV file a LanceDB store would share with it
    _ingest(dup, store, manifest=manifest)
    y = str((dup / "y.txt").resolve())
    with Store.open(store) as st:
        kv_file = store / "kv" / st.kv_files(st.document(y))[0]
        _damage_tensor_bytes(kv_file)
        assert st.is_intact(st.document(y))  # the header still parses: only the checksum tells
        assert not st.is_intact(st.document(y), checksums=True)
        with pytest.raises(DamagedChunkError, match=rf"{kv_file.name} of document {y} is damaged .*checksum.*"
                                                    rf"cagkit store repair"):
            st.load_chunk(st.chunk_ids(y)[-1])  # the damaged bytes are the last chunk's
    assert _cli("store", "verify", "--store", store) == 1
    out = capsys.readouterr().out
    assert f"damaged {y}" in out and "x.txt" not in out
    assert _cli("store", "verify", "--store", store, "--json") == 1
    assert json.loads(capsys.readouterr().out)["damaged"] == [y]
    report = _ingest(dup, store)  # not "unchanged": the next ingest rebuilds it
    assert report.updated == [y] and len(report.unchanged) == 1
    assert _cli("store", "verify", "--store", store) == 0


def test_store_info_agrees_with_verify_on_changed_tensor_bytes(tiny_llama, dup, tmp_path, capsys, manifest):
    store = tmp_path / "s"
    (dup / "y.txt").write_text(FERRY)  # not x's text, whose KV file a LanceDB store would share with it
    _ingest(dup, store, manifest=manifest)
    y = str((dup / "y.txt").resolve())
    with Store.open(store) as st:
        _damage_tensor_bytes(store / "kv" / st.kv_files(st.document(y))[0])
    x = str((dup / "x.txt").resolve())

    def states() -> dict:  # per document row of `store info`: chunks, tokens, KV MB, state, path
        return {line.split()[-1]: line.split()[3] for line in capsys.readouterr().out.splitlines() if ".txt" in line}

    assert _cli("store", "info", "--store", store) == 1
    assert states() == {y: "damaged", x: "ok"}
    assert _cli("store", "info", "--store", store, "--json") == 1
    assert {d["path"]: d["state"] for d in json.loads(capsys.readouterr().out)["per_document"]} == {y: "damaged",
                                                                                                   x: "ok"}
    # --quick reads the headers alone, which are intact (its --help says what it leaves unchecked)
    assert _cli("store", "info", "--store", store, "--quick") == 0
    assert states() == {y: "ok", x: "ok"}


@pytest.mark.parametrize("replaced", ["a", "b"])
def test_a_chunk_whose_document_was_replaced_after_the_search_is_skipped_with_the_reason(tmp_path, manifest,
                                                                                           replaced):
    """A writer that replaces a document between a reader's search and its reading of the chunks (a background
    ingest of `cagkit serve`) leaves that document's hits unreadable: they are skipped as `replaced`, the others
    answer, and when none is left the error says to try again. Replacing the last document written ("b") gives
    its new rows the old ids in SQLite: they are told apart by what they hold."""
    from s3server import fake_chunks, settings_for

    from cagkit.ask import load_chunks
    from cagkit.store import ChunkGoneError

    store = tmp_path / "s"
    with Store.open_for_writing(store, settings_for("fp"), manifest=manifest) as st:
        st.write_document("a", "a" * 64, *fake_chunks("one two three. four five.", seed=1))
        st.write_document("b", "b" * 64, *fake_chunks("six seven. eight nine.", seed=2))
    kept = "b" if replaced == "a" else "a"
    with Store.open(store) as reader:
        hits = reader.search(np.full(8, 8 ** -0.5, dtype=np.float32), top_k=4)
        assert {h.doc_path for h in hits} == {"a", "b"}
        with Store.open_for_writing(store, settings_for("fp")) as writer:
            writer.write_document(replaced, "c" * 64, *fake_chunks("ten, again. eleven twelve.", seed=3))
        chunks, skipped = load_chunks(reader, hits)
        assert [(c.doc_path, c.idx) for c in chunks] == [(h.doc_path, h.idx) for h in hits if h.doc_path == kept]
        assert sorted((s["document"], s["chunk"], s["reason"]) for s in skipped) == \
            sorted((replaced, h.idx, "replaced") for h in hits if h.doc_path == replaced)
        with pytest.raises(ChunkGoneError, match="replaced or removed since.*; try again"):
            load_chunks(reader, [h for h in hits if h.doc_path == replaced])


def test_a_chunk_whose_file_a_writer_deleted_while_it_was_read_is_replaced_not_damaged(tmp_path, monkeypatch):
    """SQLite: a writer that replaces a document deletes its old KV files at once; a reader that had read a chunk's
    row just before finds the file gone, which is a replaced chunk (try again), not damage (repair the store)."""
    from s3server import fake_chunks, settings_for

    from cagkit.store import ChunkGoneError

    store_module = importlib.import_module("cagkit.store.store")
    store = tmp_path / "s"
    with Store.open_for_writing(store, settings_for("fp")) as st:
        st.write_document("a", "a" * 64, *fake_chunks("one two three. four five.", seed=1))
    read_chunks = store_module.read_chunks

    def replaced_meanwhile(*args, **kwargs):
        with Store.open_for_writing(store, settings_for("fp")) as writer:
            writer.write_document("a", "c" * 64, *fake_chunks("ten, again. eleven twelve.", seed=3))
        return read_chunks(*args, **kwargs)

    with Store.open(store) as reader:
        first = reader.chunk_ids("a")[0]
        monkeypatch.setattr(store_module, "read_chunks", replaced_meanwhile)
        with pytest.raises(ChunkGoneError, match=f"chunk {first} is not in store"):
            reader.load_chunk(first)


def test_ask_answers_from_the_undamaged_chunks_and_names_the_skipped(tiny_llama, dup, tmp_path, capsys):
    from cagkit.ask import ask

    store, y = _ferry_store(dup, tmp_path)
    with Store.open(store) as st:
        _damage_tensor_bytes(store / "kv" / st.kv_files(st.document(y))[0])
    answer = ask("When does the ferry leave?", store=store, model="tiny-llama", top_k=3, max_new_tokens=2, mode="mot")
    assert answer.skipped and {(s["document"], s["reason"]) for s in answer.skipped} == {(y, "damaged")}
    # the sources are the chunks the answer read: the retrieved ones less the skipped
    with Store.open(store) as st:
        retrieved = min(3, st.num_chunks())
    read, skipped = ({(s["document"], s["chunk"]) for s in found} for found in (answer.sources, answer.skipped))
    assert not read & skipped and len(read) + len(skipped) == retrieved
    assert answer.context_tokens > 0
    err = capsys.readouterr().err  # the library says it in the answer; the command prints it
    assert "skipped" not in err and y not in err  # (a first model load may print transformers' loading bar)
    assert answer.to_dict()["skipped"] == answer.skipped
    assert _cli("ask", "When does the ferry leave?", "--store", store, "--model", "tiny-llama", "--top-k", "3",
                "--max-new-tokens", "2", "--mode", "mot", "--json") == 0
    err = capsys.readouterr().err
    assert err.count("warning: skipped chunk") == len(answer.skipped) and "cagkit store repair" in err
    later = ask("Where is the lighthouse?", store=store, model="tiny-llama", top_k=1, max_new_tokens=1,
                retrieval="lexical", mode="mot")
    assert later.skipped == []  # one answer's skipped chunks are not the next one's


def test_an_old_store_gets_checksums_and_its_shared_file_is_kept(tiny_llama, dup, tmp_path):
    """A store as ca1dd3f wrote it (two identical documents in one file, no checksums) is migrated: checksums are
    computed from the files, and editing one document no longer deletes the other's KV."""
    from tests.store.test_migrations import as_written_by_ca1dd3f

    store = tmp_path / "s"
    _ingest(dup, store, prefill="chunks")  # as every store before document caches was written
    x, y = str((dup / "x.txt").resolve()), str((dup / "y.txt").resolve())
    as_written_by_ca1dd3f(store)
    with sqlite3.connect(store / "manifest.sqlite") as conn:  # one file for both, as content hashes named them
        shared = conn.execute("SELECT kv_file FROM documents WHERE path = ?", (x,)).fetchone()[0]
        dropped = conn.execute("SELECT kv_file FROM documents WHERE path = ?", (y,)).fetchone()[0]
        conn.execute("UPDATE documents SET kv_file = ?", (shared,))
    conn.close()
    (store / "kv" / dropped).unlink()
    (dup / "x.txt").write_text(REPAINTED + "\n")
    report = _ingest(dup, store, prefill="chunks")
    assert report.updated == [x] and report.unchanged == [y]
    with Store.open(store) as st:
        assert (store / "kv" / shared).exists()
        assert st.load_chunk(st.chunk_ids(y)[0]).text == ORLIMAR
        assert st.verify()["ok"]


# -- 3: verify and repair --------------------------------------------------------------------------------------

def test_repair_rebuilds_what_it_can_names_the_rest_and_drops_cagkits_orphans(tiny_llama, dup, tmp_path, capsys):
    store = tmp_path / "s"
    _ingest(dup, store)
    ingest_texts([("note-1", FERRY)], store=store, source="tiny-llama", chunk_tokens=32, progress=False)
    x = str((dup / "x.txt").resolve())
    with Store.open(store) as st:
        _damage_tensor_bytes(store / "kv" / st.kv_files(st.document(x))[0])
        _damage_tensor_bytes(store / "kv" / st.kv_files(st.document("note-1"))[0])
    with Store.open_for_writing(store, st.settings) as st:  # what a run killed while writing leaves
        st._record_file("0000000000000000-deadbeef.00000.safetensors")
    (store / "kv" / "0000000000000000-deadbeef.00000.safetensors").write_bytes(b"partial")
    (store / "kv" / "0000000000000000-deadbeef.00000.safetensors.123.0.tmp").write_bytes(b"partial")
    (store / "kv" / "notes.txt").write_text("notes")
    assert _cli("store", "verify", "--store", store) == 1
    out = capsys.readouterr().out
    assert "2 damaged, 2 orphaned" in out and "not cagkit's: kv/notes.txt" in out
    assert _cli("store", "repair", "--store", store, "--quiet") == 1  # note-1 has no file to rebuild it from
    captured = capsys.readouterr()
    assert f"rebuilt {x}" in captured.out and "2 orphaned files removed" in captured.out
    assert "not rebuilt note-1" in captured.err and "cagkit store remove note-1" in captured.err
    with Store.open(store) as st:
        found = st.verify()
    assert found["damaged"] == ["note-1"] and found["orphans"] == [] and found["foreign"] == ["notes.txt"]
    assert sorted(os.listdir(store / "kv"))[-1] == "notes.txt"


def test_a_damaged_manifest_is_a_one_line_error_everywhere(tiny_llama, dup, tmp_path, capsys):
    store = tmp_path / "s"
    _ingest(dup, store)
    manifest = store / "manifest.sqlite"
    data = bytearray(manifest.read_bytes())
    page = 4096
    data[page:] = os.urandom(len(data) - page)  # the header page intact, every table's pages garbage
    manifest.write_bytes(bytes(data))
    assert _cli("store", "info", "--store", store) == 2
    assert _cli("ask", "anything?", "--store", store, "--model", "tiny-llama") == 2
    assert _cli("ingest", dup, "--store", store, "--source", "tiny-llama", "--quiet") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: ") == 3 and "damaged" in err
    assert _cli("store", "verify", "--store", store) == 1
    assert "damaged" in capsys.readouterr().out


def test_a_store_that_cannot_be_written_is_a_one_line_error(tiny_llama, dup, tmp_path, monkeypatch):
    store = tmp_path / "s"
    _ingest(dup, store)
    real_unlink = type(store).unlink

    def read_only(self, *a, **k):
        if self.parent.name == "kv":
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, *a, **k)

    with monkeypatch.context() as patch:
        patch.setattr(type(store), "unlink", read_only)
        with pytest.raises(StoreError, match=rf"cannot write to store {store} \(Permission denied\)"):
            remove([dup / "x.txt"], store=store)
    with monkeypatch.context() as patch:
        patch.setattr(os, "access", lambda path, mode: False)
        with pytest.raises(StoreError, match=rf"cannot write to store {store} .*read-only"):
            _ingest(dup, store)
        with pytest.raises(StoreError, match="read-only"):
            remove([dup / "y.txt"], store=store)


# -- 4: one-line errors and small things -----------------------------------------------------------------------

@pytest.mark.parametrize("doc_id", [None, 123, ""])
def test_a_bad_document_id_is_refused_before_the_model_loads(doc_id, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(CagkitError, match=rf"document id {doc_id!r} is not a non-empty string"):
        ingest_texts([(doc_id, "text")], store=tmp_path / "s", source="tiny-llama", progress=False)


def test_a_closed_pipe_on_stdout_is_no_traceback(tiny_llama, dup, tmp_path, monkeypatch):
    store = tmp_path / "s"
    _ingest(dup, store)

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert _cli("store", "info", "--store", store) == 141


def test_prune_drops_only_documents_whose_files_vanished(tiny_llama, dup, tmp_path):
    store = tmp_path / "s"
    other = tmp_path / "other"
    other.mkdir()
    (other / "ferry.txt").write_text(FERRY)
    _ingest(dup, store)
    ingest_texts([("note-1", FERRY)], store=store, source="tiny-llama", chunk_tokens=32, progress=False)
    assert _ingest(other, store, prune=True).removed == []  # x.txt and y.txt still exist
    (dup / "y.txt").unlink()
    assert _ingest(other, store, prune=True).removed == [str((dup / "y.txt").resolve())]
    with Store.open(store) as st:
        assert {os.path.basename(d.path) for d in st.documents()} == {"x.txt", "ferry.txt", "note-1"}


def test_ingest_wait_takes_its_turn_on_the_cli(tiny_llama, dup, tmp_path, capsys):
    store = tmp_path / "s"
    _ingest(dup, store)
    (dup / "z.txt").write_text(FERRY)
    with Store.open(store) as st:
        settings = st.settings
    codes = []
    with Store.open_for_writing(store, settings):
        waiter = threading.Thread(target=lambda: codes.append(
            _cli("ingest", dup, "--store", store, "--source", "tiny-llama", "--chunk-tokens", 32, "--quiet", "--wait")))
        waiter.start()
        time.sleep(1.0)
        assert waiter.is_alive() and codes == []
    waiter.join(timeout=60)
    assert codes == [0] and "1 added" in capsys.readouterr().out
    assert _cli("ingest", dup, "--store", store, "--source", "tiny-llama", "--chunk-tokens", 32, "--quiet") == 0


def test_a_symlink_loop_is_reported_as_one(tmp_path):
    from cagkit.ingest.documents import find_documents

    (tmp_path / "a.txt").symlink_to(tmp_path / "b.txt")
    (tmp_path / "b.txt").symlink_to(tmp_path / "a.txt")
    with pytest.raises(CagkitError, match="a.txt: a symbolic link loop"):
        find_documents([tmp_path / "a.txt"])


def test_links_in_a_folder_are_stored_where_linked_or_named_as_skipped(tiny_llama, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "ferry.txt").write_text(FERRY)
    (elsewhere / "sub" / "note.txt").write_text(REPAINTED)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "own.txt").write_text(ORLIMAR)
    (docs / "ferry.txt").symlink_to(elsewhere / "ferry.txt")  # a file linked into the folder
    (docs / "sub").symlink_to(elsewhere / "sub")  # a folder linked into it: not followed
    (docs / "gone.txt").symlink_to(tmp_path / "nothing.txt")
    (docs / "loop").symlink_to(docs / "loop")
    store = tmp_path / "s"
    assert _cli("ingest", docs, "--store", store, "--source", "tiny-llama", "--chunk-tokens", 32, "--quiet") == 1
    err = capsys.readouterr().err.splitlines()
    assert sorted(line.split(": ", 1)[0] for line in err) == [f"skipped {docs / name}" for name in
                                                             ("gone.txt", "loop", "sub")]
    assert any("a symbolic link to a folder" in line and "ingest its target" in line for line in err)
    assert any("a broken symbolic link" in line for line in err) and any("link loop" in line for line in err)
    with Store.open(store) as st:
        assert sorted(d.path for d in st.documents()) == [str(docs.resolve() / "ferry.txt"),
                                                          str((docs / "own.txt").resolve())]
    assert _cli("store", "remove", docs, "--store", store) == 0  # the folder's documents, the linked one too
    with Store.open(store) as st:
        assert st.documents() == []
    assert (elsewhere / "ferry.txt").read_text() == FERRY  # the link's target is only read


# -- 5: long documents in parts --------------------------------------------------------------------------------

LONG = "\n\n".join(f"Paragraph {i} says that the tide at pier {i} turns at {i % 12 + 1} o'clock." for i in range(40))


def test_a_long_document_is_written_in_parts_as_it_is_prefilled(tiny_llama, tmp_path, monkeypatch):
    from cagkit.generation import context_prefix
    from cagkit.kv.prefill import prefill_kv
    from cagkit.store.store import DocumentWriter

    monkeypatch.setattr(pipeline, "PART_TOKENS", 64)
    added, moved = [], []
    real_add = DocumentWriter.add
    monkeypatch.setattr(DocumentWriter, "add", lambda self, chunks, vectors: (added.append(
        sum(len(c.token_ids) for c in chunks)), real_add(self, chunks, vectors))[1])

    class Bar:
        total, n = 0, 0

        def update(self, n):
            moved.append(n)

        def set_postfix(self, **kw):
            pass

        def close(self):
            pass

    bar = Bar()
    monkeypatch.setattr(pipeline, "_progress_bar", lambda tokens, lm, enabled: (setattr(bar, "total", tokens), bar)[1])
    report = ingest_texts([("tides", LONG)], store=tmp_path / "s", source="tiny-llama", chunk_tokens=32)
    assert len(added) > 5 and max(added) <= 64  # never more than a part's tokens in memory
    assert len(moved) == len(added) and sum(moved) == bar.total == report.tokens  # the bar moves within it
    with Store.open(tmp_path / "s") as st:
        doc = st.document("tides")
        assert len(st.kv_files(doc)) == len(added) and doc.n_tokens == report.tokens
        ids = st.chunk_ids("tides")
        texts = [st.load_chunk(i).text for i in ids]
        assert "\n\n".join(texts) == LONG
        chunks = [st.load_chunk(i) for i in ids]
    # the parts were read one after another, as one prefill of the prompt prefix and the whole text reads them
    prefix = context_prefix(tiny_llama)
    whole = prefill_kv(tiny_llama.model, prefix + [t for c in chunks for t in c.token_ids])
    last = chunks[-1]
    start = len(prefix) + last.position
    torch.testing.assert_close(last.kv.keys.float(), whole.keys[:, start:start + len(last.token_ids)], atol=2e-3,
                               rtol=2e-3)


def test_an_interrupted_long_document_is_begun_again_cleanly(tiny_llama, tmp_path, monkeypatch):
    from cagkit.store.store import DocumentWriter

    store = tmp_path / "s"
    monkeypatch.setattr(pipeline, "PART_TOKENS", 64)
    ingest_texts([("short", FERRY)], store=store, source="tiny-llama", chunk_tokens=32, progress=False)
    calls = []
    real_add = DocumentWriter.add

    def dies_on_the_third_part(self, chunks, vectors):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real_add(self, chunks, vectors)

    with monkeypatch.context() as patch:  # a kill: no chance to clean up
        patch.setattr(DocumentWriter, "add", dies_on_the_third_part)
        patch.setattr(DocumentWriter, "abort", lambda self: None)
        with pytest.raises(KeyboardInterrupt):
            ingest_texts([("short", FERRY), ("tides", LONG)], store=store, source="tiny-llama", chunk_tokens=32,
                         progress=False)
    with Store.open(store) as st:  # readers never see the half-written document
        assert [d.path for d in st.documents()] == ["short"]
    assert len(os.listdir(store / "kv")) == 3  # "short" and two parts of "tides"
    report = ingest_texts([("short", FERRY), ("tides", LONG)], store=store, source="tiny-llama", chunk_tokens=32,
                          progress=False)
    assert report.added == ["tides"] and report.unchanged == ["short"] and len(report.orphans) == 2
    with Store.open(store) as st:
        assert st.verify()["ok"] and st.verify()["orphans"] == []
        assert len(os.listdir(store / "kv")) == 1 + len(st.kv_files(st.document("tides")))


def test_an_unbroken_line_is_cut_at_tokens_with_few_tokenizer_calls(tiny_llama):
    from cagkit.ingest.chunking import chunk_text

    rng = np.random.default_rng(0)
    line = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz0123456789.,;-"), 200_000))
    calls = []

    def count(text):
        calls.append(len(text))
        return tiny_llama.count_tokens(text)

    def token_ends(text):
        calls.append(len(text))
        return pipeline._token_ends(tiny_llama)(text)

    chunks = chunk_text(line, count, 128, token_ends=token_ends)
    assert "".join(c.text for c in chunks) == line
    assert all(tiny_llama.count_tokens(c.text) <= 128 for c in chunks)
    assert sum(tiny_llama.count_tokens(c.text) for c in chunks) >= 0.9 * 128 * len(chunks)  # full chunks
    assert len(calls) <= 3 * len(chunks) + 3  # three tokenizer calls per chunk ...
    assert max(calls) <= 8 * 128  # ... none over more than a window of the line


def test_chunk_checksums_are_xxh3_and_a_store_with_sha256_checksums_reads_and_verifies_as_it_is(
        tiny_llama, dup, tmp_path, capsys):
    from cagkit.store.kvfile import KVFile
    from cagkit.store.store import DamagedChunkError

    store, y = _ferry_store(dup, tmp_path)
    with sqlite3.connect(store / "manifest.sqlite") as db:
        rows = db.execute("SELECT id, kv_file, idx, checksum FROM chunks").fetchall()
        assert rows and all(c.startswith("xxh3-128:") and len(c) == len("xxh3-128:") + 32 for *_, c in rows)
        for chunk_id, kv_file, idx, _ in rows:  # as a store written before XXH3 recorded them: bare SHA-256
            sha = KVFile(store / "kv" / kv_file).checksum(idx, like="0" * 64)
            assert len(sha) == 64 and int(sha, 16) >= 0
            db.execute("UPDATE chunks SET checksum = ? WHERE id = ?", (sha, chunk_id))
    assert _cli("store", "verify", "--store", store) == 0
    with Store.open(store) as st:
        assert all(st.load_chunk(c).kv.num_tokens > 0 for c in st.chunk_ids(y))
        _damage_tensor_bytes(store / "kv" / st.kv_files(st.document(y))[0])
        with pytest.raises(DamagedChunkError, match="does not match its checksum"):
            st.load_chunk(st.chunk_ids(y)[-1])
    capsys.readouterr()
    assert _cli("store", "verify", "--store", store) == 1
    assert f"damaged {y}" in capsys.readouterr().out


def test_a_local_kv_file_is_read_memory_mapped_as_the_copying_read_gives_and_loaded_tensors_never_write_it(
        tiny_llama, dup, tmp_path, monkeypatch):
    from cagkit.store import kvfile
    from cagkit.store.store import DamagedChunkError

    store, y = _ferry_store(dup, tmp_path)
    with Store.open(store) as st:
        ids = st.chunk_ids(y)
        file = store / "kv" / st.kv_files(st.document(y))[0]
        before = file.read_bytes()
        mapped = st.load_chunks(ids)
        assert all(isinstance(b, memoryview) for b in kvfile.KVFile(file)._read([(0, 8), (8, 16)]))
        monkeypatch.setattr(kvfile, "MEMORY_MAP", False)
        copied = st.load_chunks(ids)
        assert all(isinstance(b, bytearray) for b in kvfile.KVFile(file)._read([(0, 8)]))
        monkeypatch.setattr(kvfile, "MEMORY_MAP", True)
        for a, b in zip(mapped, copied, strict=True):
            assert a.token_ids == b.token_ids and torch.equal(a.kv.keys, b.kv.keys)
            assert torch.equal(a.kv.values, b.kv.values)
        mapped[0].kv.keys.fill_(7.0)  # a tensor over the map is writable; the file is not written
        assert file.read_bytes() == before and not torch.equal(mapped[0].kv.keys, copied[0].kv.keys)
        assert torch.equal(st.load_chunk(ids[0]).kv.keys, copied[0].kv.keys)
        file.write_bytes(before[:-200])  # cut short after its header: the last chunk is damaged, not a crash
        with pytest.raises(DamagedChunkError, match="damaged"):
            st.load_chunk(ids[-1])
