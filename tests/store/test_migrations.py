"""Numbered store migrations: a store as an older cagkit wrote it is brought to the current format once, in order."""

from __future__ import annotations

import re
import sqlite3

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from cagkit.errors import StoreError
from cagkit.ingest.pipeline import ingest
from cagkit.store import migrations
from cagkit.store.store import Store

TEXT = ("The ferry to Inish Mor leaves at nine. It returns at six in summer.\n\n"
        "Tickets cost twelve euro. Bicycles travel free on weekdays.")


def _ingest(docs, store, prefill="chunks"):
    """Chunks prefilled alone, as every store before document caches was written (unless `prefill` says)."""
    return ingest([docs], store=store, source="tiny-llama", chunk_tokens=32, progress=False, prefill=prefill)


def as_written_by_ca1dd3f(store):
    """Turn a store into the layout cagkit wrote at ca1dd3f: no migrations table, KV files without sentences, and
    no record of each chunk's file and checksum or of the files written."""
    for file in (store / "kv").iterdir():
        save_file({k: v for k, v in load_file(file).items() if "sentence" not in k}, str(file))
    with sqlite3.connect(store / "manifest.sqlite") as conn:
        conn.execute("DROP TABLE migrations")
        conn.execute("DROP TABLE kv_files")
        conn.execute("DROP INDEX chunks_kv_file")
        conn.execute("ALTER TABLE chunks DROP COLUMN kv_file")
        conn.execute("ALTER TABLE chunks DROP COLUMN checksum")
        conn.execute("ALTER TABLE documents DROP COLUMN prefill")
        conn.execute("ALTER TABLE documents DROP COLUMN window")
    conn.close()


@pytest.fixture
def old_store(tiny_llama, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ferry.txt").write_text(TEXT)
    store = tmp_path / "store"
    _ingest(docs, store)
    current = {f.name: load_file(f) for f in (store / "kv").iterdir()}
    as_written_by_ca1dd3f(store)
    return docs, store, current


def _applied(store):
    with sqlite3.connect(store / "manifest.sqlite") as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM migrations ORDER BY applied_at, rowid")]
    conn.close()
    return names


def test_migrations_are_numbered_in_order():
    names = [m.__name__ for m in migrations.MIGRATIONS]
    assert [int(re.match(r"m(\d{3})_\w+$", n).group(1)) for n in names] == list(range(1, len(names) + 1))


def test_an_old_store_is_migrated_by_the_next_ingest_without_prefilling(old_store):
    docs, store, current = old_store
    report = _ingest(docs, store)
    path = str((docs / "ferry.txt").resolve())
    assert report.upgraded == [path] and report.unchanged == [path] and report.tokens == 0
    assert _applied(store) == [m.__name__ for m in migrations.MIGRATIONS]
    for name, tensors in current.items():  # the KV kept bit for bit, the sentences as a fresh ingest writes them
        migrated = load_file(store / "kv" / name)
        assert migrated.keys() == tensors.keys()
        for key, value in tensors.items():
            if key.endswith(".sentence_embeddings"):
                torch.testing.assert_close(migrated[key], value, atol=2e-3, rtol=0)  # fp16 of the same embedding
            else:
                assert torch.equal(migrated[key], value), key
    assert _ingest(docs, store).upgraded == []  # once


def test_an_old_store_opened_for_reading_is_migrated_and_loads_its_sentences(old_store):
    docs, store, _ = old_store
    with Store.open(store) as st:
        doc = st.documents()[0]
        chunk = st.load_chunk(st.chunk_ids(doc.path)[0])
    spans, vectors = chunk.sentences
    assert [chunk.text[a:b] for a, b in spans.tolist()] == ["The ferry to Inish Mor leaves at nine.",
                                                            "It returns at six in summer."]
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=2e-3)
    assert _applied(store) == [m.__name__ for m in migrations.MIGRATIONS]


def test_an_old_stores_documents_are_known_to_be_prefilled_alone_until_ingest_reads_them_whole(old_store):
    docs, store, _ = old_store
    path = str((docs / "ferry.txt").resolve())
    with Store.open(store) as st:
        assert (st.document(path).prefill, st.document(path).window) == ("chunks", None)
        assert st.load_chunk(st.chunk_ids(path)[0]).context is None
        assert st.summary()["per_document"][0]["prefill"] == "chunks"
    report = _ingest(docs, store, prefill="document")  # the default: the document is read again, whole
    assert report.updated == [path] and report.tokens > 0
    with Store.open(store) as st:
        doc = st.document(path)
        assert doc.prefill == "document" and doc.window == 4096  # the tiny model's context length
        assert [st.load_chunk(i).position for i in st.chunk_ids(path)][0] == 0
    assert _ingest(docs, store, prefill="document").unchanged == [path]


def test_a_store_migrated_by_a_newer_cagkit_is_refused(old_store):
    docs, store, _ = old_store
    _ingest(docs, store)
    with sqlite3.connect(store / "manifest.sqlite") as conn:
        conn.execute("INSERT INTO migrations VALUES ('m999_from_the_future', 0)")
    conn.close()
    with pytest.raises(StoreError, match=r"upgraded by a newer cagkit \(migration m999_from_the_future\); upgrade"):
        Store.open(store)
