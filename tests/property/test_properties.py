"""Property-based tests (issue 31): the chunker, the tokenizer alignment and the store round trip, on arbitrary
unicode, empty and huge input, and one-token documents. Each property is an invariant the code promises in its
docstring; hypothesis searches for input that breaks it."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cagkit.config import KV_DTYPES
from cagkit.errors import CagkitError
from cagkit.ingest.chunking import chunk_text
from cagkit.kv.chunk import ChunkKV
from cagkit.store.store import NewChunk, Store, StoreSettings
from cagkit.translate.alignment import align

PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.data_too_large])

# -- text strategies --------------------------------------------------------------------------------------------

# Pieces that stress every separator level: paragraph and sentence breaks, CJK full stops, closing quotes, odd
# whitespace (NBSP, ideographic space, line separator), zero-width characters, emoji with joiners, combining marks.
_PIECES = ["word", "Wörter", "北京", "東京タワー", "naïve", "café", "😀", "👩‍👩‍👧", "🇮🇪", "e\u0301", "\u200b", "\ufeff",
           "مرحبا", "שלום", "नमस्ते", "x" * 40, ".", "!", "?", "…", "。", "！", "\"", "”", "’", ")", "]",
           " ", "  ", "\t", "\n", "\n\n", "\n \n", "\r\n", "\xa0", "\u3000", "\u2028", "\x0b", "\x1c", "\x85"]

_NO_SPACE = st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc"))



def texts(longest_word: int = 3000):
    """Arbitrary unicode, empty and whitespace-only text, one character, one huge unbroken word of up to
    `longest_word` repeats, mixed scripts and separators, many newlines."""
    return st.one_of(
    st.text(),  # arbitrary unicode, empty included
    st.text(alphabet=st.sampled_from(" \t\n\r\x0b\x0c\xa0\u3000\u2028\u2029\x85\x1c"), max_size=50),  # only space
    st.characters(blacklist_categories=("Cs",)),  # one character
    # one huge unbroken word: a few characters repeated to thousands
    st.builds(lambda w, n: w * n, st.text(alphabet=_NO_SPACE, min_size=1, max_size=4), st.integers(300, longest_word)),
    st.lists(st.sampled_from(_PIECES), max_size=200).map("".join),  # mixed scripts, separators
    st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=8)), max_size=60).map("".join),
    st.builds(lambda n, t: "\n" * n + t + "\n" * n, st.integers(0, 500), st.text(max_size=20)),  # many newlines
    )


TEXTS = texts()

# -- 1. the chunker ---------------------------------------------------------------------------------------------


def _utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


@pytest.fixture(scope="module")
def counters(smollm2_tokenizer):
    """(count_tokens, token_ends) pairs: the real tokenizer as ingest uses it, without the token-ends shortcut, and
    a UTF-8 byte counter (a character can cost up to 4)."""
    def count(text):
        return len(smollm2_tokenizer(text, add_special_tokens=False)["input_ids"])

    def ends(text):
        enc = smollm2_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [e for _, e in enc["offset_mapping"]]

    return {"smollm2+token_ends": (count, ends), "smollm2": (count, None), "utf8-bytes": (_utf8_bytes, None)}


def check_chunks(text, chunks, count, max_tokens):
    """The chunker's contract: each chunk is text[char_start:char_end], non-empty and trimmed, within the budget;
    chunks in order and disjoint; only whitespace is left out."""
    position = 0
    for chunk in chunks:
        assert 0 <= chunk.char_start < chunk.char_end <= len(text)
        assert text[chunk.char_start:chunk.char_end] == chunk.text
        assert chunk.text.strip() == chunk.text  # no leading or trailing whitespace
        assert count(chunk.text) <= max_tokens, (chunk.text, count(chunk.text))
        assert chunk.char_start >= position  # in order, no overlap
        assert text[position:chunk.char_start].strip() == ""  # nothing but whitespace skipped
        position = chunk.char_end
    assert text[position:].strip() == ""
    if text.strip() == "":
        assert chunks == []


@pytest.mark.parametrize("counter", ["smollm2+token_ends", "smollm2", "utf8-bytes"])
@PROPERTY
@given(text=TEXTS, max_tokens=st.one_of(st.integers(1, 8), st.integers(16, 80)))
@example(text="", max_tokens=16)
@example(text=" \n\n\t ", max_tokens=16)
@example(text="a", max_tokens=1)
@example(text="😀", max_tokens=16)
@example(text="\n" * 2000, max_tokens=16)
@example(text="Ab" * 40_000, max_tokens=16)  # one word longer than the chunker ever counts whole (64 Ki chars)
@example(text="北京。" * 3000 + "\n\n" + "word " * 3000, max_tokens=32)
def test_chunks_fit_index_the_text_and_cover_it(counters, counter, text, max_tokens):
    count, ends = counters[counter]
    try:
        chunks = chunk_text(text, count, max_tokens, token_ends=ends)
    except CagkitError as exc:
        # refused only when some single character is over the budget on its own, and the message says which
        assert "too small" in str(exc)
        assert any(count(c) > max_tokens for c in text if not c.isspace()), str(exc)
        return
    check_chunks(text, chunks, count, max_tokens)


# -- 2. tokenizer alignment -------------------------------------------------------------------------------------


def _offsets(tokenizer, text):
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return torch.tensor(enc["offset_mapping"], dtype=torch.long).reshape(-1, 2)


def check_alignment(source, target):
    """align()'s contract, checked for both modes on [Ts, 2] source and [Tt, 2] target spans (vectorised, so a
    few thousand tokens check in milliseconds)."""
    num_target, num_source = len(target), len(source)
    starts, ends = source[:, 0], source[:, 1]
    nonempty = ends > starts  # [Ts]
    shared = (torch.minimum(target[:, None, 1], ends[None]) - torch.maximum(target[:, None, 0], starts[None])
              ).clamp(min=0)  # [Tt, Ts] characters in common
    for mode in ("cover", "overlap"):
        weights = align(source, target, mode)
        assert weights.shape == (num_target, num_source) and weights.dtype == torch.float32
        assert torch.isfinite(weights).all() and (weights >= 0).all()
        assert torch.allclose(weights.sum(dim=1), torch.ones(num_target), atol=1e-5)  # every row sums to 1
    cover = align(source, target, "cover")
    assert torch.equal(cover.sum(dim=1), torch.ones(num_target))
    assert torch.equal((cover == 1).sum(dim=1), torch.ones(num_target, dtype=torch.long))  # one-hot rows
    chosen = cover.argmax(dim=1)  # [Tt]
    # the character a target token is read at: its last one, or for an empty span the one just before it
    t_start, t_end = target[:, 0], target[:, 1]
    last = torch.where(t_end > t_start, t_end - 1, t_start - 1).clamp(min=0)  # [Tt]
    if nonempty.any() and num_target:
        assert nonempty[chosen].all()  # an empty source span covers nothing: never chosen while another exists
        before = (starts[None] <= last[:, None]) & nonempty[None]  # [Tt, Ts]
        holds = before & (last[:, None] < ends[None])
        held = holds.any(dim=1)
        # a source token holds the character: the chosen one holds it too
        assert holds[torch.arange(num_target), chosen][held].all()
        # a gap no source token holds (trimmed whitespace): the nearest token that starts before it
        gap = ~held & before.any(dim=1)
        nearest = torch.where(before, starts[None], -1).max(dim=1).values
        assert torch.equal(starts[chosen][gap], nearest[gap])
    overlap = align(source, target, "overlap")
    total = shared.sum(dim=1)
    rows = total > 0
    # weighted by shared characters, nothing else; rows with no shared character take the covering token
    assert torch.allclose(overlap[rows], shared[rows].float() / total[rows, None].float(), atol=1e-6)
    assert torch.equal(overlap[~rows], cover[~rows])


@PROPERTY
@given(text=texts(longest_word=300))
@example(text="Héllo  world,\n\n  naïve café — 北京 test😀 end.")
@example(text="a")
@example(text="😀")
@example(text="")
@example(text="   ")
def test_alignment_of_two_real_tokenizations(real_tokenizers, text):
    for target_alias in ("gemma", "qwen"):
        source = _offsets(real_tokenizers["smollm2"], text)
        target = _offsets(real_tokenizers[target_alias], text)
        if len(source) == 0:
            with pytest.raises(ValueError):
                align(source, target, "cover")
            continue
        check_alignment(source, target)
        if len(target):
            check_alignment(target, source)  # and the other way round


@st.composite
def spans(draw, length, min_size=0):
    """Char spans into a text of `length` characters, in reading order, as tokenizers give them: possibly empty,
    repeated (byte-fallback pieces of one character) and with gaps (trimmed whitespace)."""
    out, position = [], 0
    for _ in range(draw(st.integers(min_size, 30))):
        position = min(length, position + draw(st.integers(0, 3)))
        kind = draw(st.sampled_from(["token", "token", "empty", "repeat"]))
        if kind == "repeat" and out:
            out.append(out[-1])
            continue
        end = position if kind == "empty" else min(length, position + draw(st.integers(1, 6)))
        out.append((position, end))
        position = end
    return out


@PROPERTY
@given(data=st.data(), length=st.integers(0, 60))
def test_alignment_of_awkward_spans(data, length):
    source = torch.tensor(data.draw(spans(length, min_size=1)), dtype=torch.long).reshape(-1, 2)
    target = torch.tensor(data.draw(spans(length)), dtype=torch.long).reshape(-1, 2)
    check_alignment(source, target)


# -- 3. the store round trip ------------------------------------------------------------------------------------


@st.composite
def documents(draw):
    """A document as ingest writes it: chunks of arbitrary text with 1..6 tokens (one-token chunks included), KV
    [L, T, H, D] with arbitrary finite and special float values, token ids, offsets and unit embeddings, written
    in one or more parts."""
    layers, heads, dim = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 4))
    n_chunks = draw(st.integers(1, 5))
    chunks = []
    position = 0
    for _ in range(n_chunks):
        text = draw(st.text(min_size=1, max_size=40))
        tokens = draw(st.integers(1, 6))
        size = layers * tokens * heads * dim
        values = st.floats(width=32, allow_nan=True, allow_infinity=True)
        keys = torch.tensor(draw(st.lists(values, min_size=size, max_size=size)), dtype=torch.float32)
        vals = torch.tensor(draw(st.lists(values, min_size=size, max_size=size)), dtype=torch.float32)
        token_ids = draw(st.lists(st.integers(0, 2**31 - 1), min_size=tokens, max_size=tokens))
        offsets = [tuple(sorted(draw(st.tuples(st.integers(0, len(text)), st.integers(0, len(text))))))
                   for _ in range(tokens)]
        shape = (layers, tokens, heads, dim)
        chunks.append(NewChunk(text, position, position + len(text), token_ids, offsets,
                               ChunkKV(keys.reshape(shape), vals.reshape(shape))))
        position += len(text) + 1
    embeddings = np.asarray(draw(st.lists(st.lists(st.floats(-1, 1, width=32), min_size=4, max_size=4),
                                          min_size=n_chunks, max_size=n_chunks)), dtype=np.float32)
    cuts = sorted(set(draw(st.lists(st.integers(1, n_chunks), max_size=3)))) if n_chunks > 1 else []
    return chunks, embeddings, [c for c in cuts if c < n_chunks]


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """A float tensor's bit patterns, so NaNs compare equal to themselves."""
    return tensor.contiguous().view({2: torch.int16, 4: torch.int32}[tensor.element_size()])


@PROPERTY
@given(doc=documents(), path=st.text(min_size=1, max_size=30), other=st.text(min_size=1, max_size=30),
       dtype=st.sampled_from(sorted(KV_DTYPES)), metadata=st.dictionaries(st.text(max_size=8), st.text(max_size=8),
                                                                         max_size=3))
@example(doc=([NewChunk("x", 0, 1, [7], [(0, 1)], ChunkKV(torch.ones(1, 1, 1, 1), -torch.ones(1, 1, 1, 1)))],
              np.ones((1, 4), np.float32), []), path="one-token", other="other", dtype="float16", metadata={})
def test_store_round_trip(doc, path, other, dtype, metadata):
    chunks, embeddings, cuts = doc
    settings_ = StoreSettings("tiny-llama", "tiny-llama-fp", dtype, 32, "none")
    with tempfile.TemporaryDirectory() as folder:
        with Store.open_for_writing(folder, settings_) as store:
            # the document in parts (as streaming ingest writes it), and a second document whole beside it
            with store.document_writer(path, "ab" * 32, metadata) as writer:
                for start, stop in zip([0, *cuts], [*cuts, len(chunks)]):
                    writer.add(chunks[start:stop], embeddings[start:stop])
                writer.commit()
            if other != path:
                store.write_document(other, "cd" * 32, chunks[:1], embeddings[:1])
        with Store.open(folder) as store:
            found = store.verify()
            assert found["ok"] and found["damaged"] == [] and found["missing"] == [] and found["orphans"] == []
            stored = store.document(path)
            assert stored.n_chunks == len(chunks) and stored.n_tokens == sum(len(c.token_ids) for c in chunks)
            assert stored.metadata == metadata
            assert {d.path for d in store.documents()} == {path, other}
            ids = store.chunk_ids(path)
            assert len(ids) == len(chunks)
            levels = {"int8": 255, "int4": 15}.get(dtype)
            want = torch.float32 if levels else getattr(torch, dtype)
            for idx, (chunk_id, chunk) in enumerate(zip(ids, chunks)):
                loaded = store.load_chunk(chunk_id)
                assert loaded.doc_path == path and loaded.idx == idx and loaded.text == chunk.text
                assert loaded.token_ids == chunk.token_ids
                assert loaded.offsets.tolist() == [list(o) for o in chunk.offsets]
                for got, wrote in ((loaded.kv.keys, chunk.kv.keys), (loaded.kv.values, chunk.kv.values)):
                    assert got.dtype == want and got.shape == wrote.shape
                    if not levels:
                        assert torch.equal(_bits(got), _bits(wrote.to(want)))  # as stored, bit for bit
                    elif wrote.numel() and wrote.isfinite().all() and wrote.abs().max() <= 1e3:
                        # compressed: within a step of its group's range (no wider than the chunk's), plus float16
                        # rounding of the scale and minimum (values past float16's range are not KV)
                        span = float(wrote.max() - wrote.min())
                        tolerance = span / levels + 1e-3 * float(wrote.abs().max()) + 1e-6
                        assert (got - wrote).abs().max() <= tolerance
            if other != path:
                (only,) = store.chunk_ids(other)
                assert store.load_chunk(only).text == chunks[0].text
