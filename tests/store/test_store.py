"""What both kinds of store do alike, each test over both (the `manifest` fixture), and `open_store`, which picks
the kind by location."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from s3server import fake_chunks, settings_for

from cagkit.errors import StoreError
from cagkit.store import Store, check_location, is_store, open_store

STORE_PACKAGE = Path(__file__).resolve().parents[2] / "cagkit" / "store"


def test_open_store_opens_the_kind_a_location_holds(tmp_path, manifest):
    store = tmp_path / "s"
    assert not is_store(store)
    with open_store(store, write=True, settings=settings_for("fp"), manifest=manifest) as st:
        assert st.kind == manifest and isinstance(st, Store.kinds[manifest])
        st.write_document("doc", "a" * 64, *fake_chunks("one two three. four five.", seed=1))
    assert is_store(store)
    check_location(store)  # a store of either kind is a good --store
    other = {"sqlite": "lance", "lance": "sqlite"}[manifest]
    # an existing store is opened as what it is, whatever a new one would be
    for opened in (lambda: open_store(store), lambda: Store.open(store), lambda: open_store(store, manifest=other),
                   lambda: open_store(store, write=True, settings=settings_for("fp"), manifest=other),
                   lambda: Store.open_for_writing(store, settings_for("fp"), manifest=other)):
        with opened() as st:
            assert st.kind == manifest and [d.path for d in st.documents()] == ["doc"]


def test_open_store_refuses_what_it_cannot_open(tmp_path):
    with pytest.raises(StoreError, match="no cagkit store at"):
        open_store(tmp_path / "nowhere")
    with pytest.raises(StoreError, match="manifest must be one of sqlite, lance, got 'csv'"):
        open_store(tmp_path / "s", write=True, settings=settings_for("fp"), manifest="csv")
    with pytest.raises(ValueError, match="needs the store's settings"):
        open_store(tmp_path / "s", write=True)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="is not empty and is not a cagkit store"):
        check_location(tmp_path / "mine")


def test_the_kinds_of_store_import_the_shared_module_not_each_other():
    def imported(name: str) -> set[str]:  # the modules of cagkit.store that module `name` imports, anywhere in it
        found = set()
        for node in ast.walk(ast.parse((STORE_PACKAGE / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "cagkit.store":
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cagkit.store."):
                found.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("cagkit.store.")}
        return found

    assert imported("store") == {"base", "kvfile", "migrations"}
    assert imported("lance") == {"base", "kvfile"}
    assert imported("migrations") == {"base", "kvfile"} and imported("base") == {"kvfile"}


def test_fake_chunks_round_trip_with_their_checksums(tmp_path, manifest):
    with Store.open_for_writing(tmp_path / "s", settings_for("fp"), manifest=manifest) as st:
        chunks, vectors = fake_chunks("one two three. four five.", seed=1)
        st.write_document("doc", "a" * 64, chunks, vectors)
        loaded = st.load_chunk(st.chunk_ids("doc")[0])
        torch.testing.assert_close(loaded.kv.keys, chunks[0].kv.keys.half())


def test_load_chunks_keeps_the_order_and_puts_each_error_in_its_place(tmp_path, manifest):
    """`load_chunks` (one manifest query and the files side by side, for LanceDB) returns what `load_chunk` returns
    for each id, in the order given, with a damaged chunk's or a gone chunk's error in place of the chunk."""
    from cagkit.store import ChunkGoneError, DamagedChunkError

    store = tmp_path / "s"
    with Store.open_for_writing(store, settings_for("fp"), manifest=manifest) as st:
        st.write_document("a", "a" * 64, *fake_chunks("one two three. four five. six.", seed=1))
        st.write_document("b", "b" * 64, *fake_chunks("seven eight. nine ten.", seed=2))
        ids = st.chunk_ids("b")[::-1] + st.chunk_ids("a")
        damaged = st.kv_files(st.document("b"))[0]
    data = bytearray((store / "kv" / damaged).read_bytes())
    data[-8:] = bytes(8)  # the file's last chunk: b's second
    (store / "kv" / damaged).write_bytes(bytes(data))
    gone = max(ids) + 1000
    with Store.open(store) as st:
        got = st.load_chunks([*ids, gone])
        assert isinstance(got[0], DamagedChunkError) and isinstance(got[-1], ChunkGoneError)
        assert [(c.doc_path, c.idx) for c in got[1:-1]] == [("b", 0), ("a", 0), ("a", 1), ("a", 2)]
        for chunk_id, chunk in zip(ids[1:], got[1:-1]):
            torch.testing.assert_close(chunk.kv.keys, st.load_chunk(chunk_id).kv.keys)
        assert st.load_chunks([]) == []
