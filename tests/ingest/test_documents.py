"""Tests for finding, reading and chunking documents."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest

from cagkit.errors import CagkitError, DocumentError
from cagkit.ingest.chunking import Chunk, chunk_text
from cagkit.ingest.documents import SUPPORTED_SUFFIXES, find_documents, read_document

# --- fixtures ----------------------------------------------------------------------------------


def make_pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF: one Helvetica text line per page (an empty string gives a page without text)."""
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        content = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET" if text else ""
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>"
        )
        objects.append(f"<< /Length {len(content)} >>\nstream\n{content}\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def long_text(seed: int = 0) -> str:
    """Deterministic multi-paragraph text with uneven whitespace, line breaks, unicode and a very long word."""
    rng = random.Random(seed)
    vocabulary = ["cache", "token", "the", "a", "model", "attention", "café", "日本語", "(layer)", '"q"', "x-y"]
    paragraphs = []
    for p in range(40):
        sentences = []
        for _ in range(rng.randint(1, 12)):
            words = [rng.choice(vocabulary) for _ in range(rng.randint(1, 30))]
            sentences.append(" ".join(words) + rng.choice([".", "!", "?", ".)", ""]))
        separator = rng.choice([" ", "  ", "\n", " \t"])
        paragraphs.append(separator.join(sentences))
        if p == 17:
            paragraphs.append("supercalifragilistic" * 30)
    return "  \n" + "\n\n".join(paragraphs).replace("\n\n", "\n \n\n", 5) + "\n\n  "


def whitespace_counter(text: str) -> int:
    return len(text.split())


def byte_counter(text: str) -> int:
    return len(text.encode()) // 4 + 1


def newline_costly_counter(text: str) -> int:
    """Line breaks cost tokens, so summing the pieces underestimates a packed chunk."""
    return len(text.split()) + 3 * text.count("\n")


@functools.cache
def bpe_counter():
    """A real byte-level BPE tokenizer, trained offline on the test text (no downloads)."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator([long_text()], trainer)
    return lambda s: len(tokenizer.encode(s).ids)


def assert_valid_chunks(text: str, chunks: list[Chunk], count, max_tokens: int) -> None:
    """Every chunk fits, matches its offsets, is trimmed; chunks are ordered, disjoint and cover all non-space."""
    assert chunks
    for chunk in chunks:
        assert chunk.text == text[chunk.char_start : chunk.char_end]
        assert chunk.text and chunk.text == chunk.text.strip()
        assert count(chunk.text) <= max_tokens
    assert text[: chunks[0].char_start].strip() == ""
    assert text[chunks[-1].char_end :].strip() == ""
    for before, after in zip(chunks, chunks[1:]):
        assert before.char_end <= after.char_start
        assert text[before.char_end : after.char_start].strip() == ""


# --- find_documents ----------------------------------------------------------------------------


def test_find_documents_recurses_sorts_and_skips_hidden_and_unsupported(tmp_path):
    for name in ["b.md", "a.txt", "sub/deep/c.PDF", "sub/d.html", "sub/e.htm", "notes.rst",
                 ".hidden.txt", ".git/config.txt", "sub/.cache/f.md", "image.png", "README"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    found = find_documents([tmp_path, tmp_path / "a.txt"])
    names = [str(p.relative_to(tmp_path)) for p in found]
    assert names == ["a.txt", "b.md", "notes.rst", "sub/d.html", "sub/deep/c.PDF", "sub/e.htm"]
    assert found == sorted(found)


def test_find_documents_accepts_explicit_files_and_str_paths(tmp_path):
    (tmp_path / "z.md").write_text("x")
    (tmp_path / "a.txt").write_text("x")
    assert find_documents([str(tmp_path / "z.md"), tmp_path / "a.txt"]) == [tmp_path / "a.txt", tmp_path / "z.md"]


def test_find_documents_missing_path_names_it(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(CagkitError, match="nope: no such file or folder"):
        find_documents([missing])


def test_find_documents_empty_folder_names_it_and_lists_suffixes(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "photo.jpg").write_text("x")
    with pytest.raises(CagkitError) as error:
        find_documents([tmp_path / "empty"])
    message = str(error.value)
    assert str(tmp_path / "empty") in message
    assert all(suffix in message for suffix in SUPPORTED_SUFFIXES)


def test_find_documents_rejects_explicit_unsupported_file(tmp_path):
    (tmp_path / "slides.pptx").write_text("x")
    with pytest.raises(CagkitError, match=r"slides\.pptx: unsupported file type \(\.pptx\)"):
        find_documents([tmp_path / "slides.pptx"])


# --- read_document -----------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".txt", ".md", ".rst"])
def test_read_text_strips_bom_and_normalises_line_endings(tmp_path, suffix):
    path = tmp_path / f"doc{suffix}"
    path.write_bytes("\ufeffcafé line one\r\nline two\rline three\n".encode())
    assert read_document(path) == "café line one\nline two\nline three\n"


def test_read_html_keeps_visible_text_and_paragraph_breaks(tmp_path):
    path = tmp_path / "page.html"
    path.write_text(
        "<!DOCTYPE html><html><head><title>Guide</title><style>p {color: red}</style>"
        "<script>var hidden = 'script text';</script></head><body><noscript>Enable JavaScript</noscript>\n"
        "<h1>Install  the\n tool</h1>\n"
        "<p>First   paragraph with <b>bold</b> text.<br>Second line.</p><!-- a comment -->\n"
        "<ul><li>one</li><li> two </li></ul>\n"
        "<pre>code\n  indented</pre><p>caf&eacute; &amp; more</p></body></html>",
        encoding="utf-8",
    )
    assert read_document(path) == (
        "Guide\n\nInstall the tool\n\nFirst paragraph with bold text.\nSecond line.\n\n"
        "one\ntwo\n\ncode\n  indented\n\ncafé & more"
    )


def test_read_htm_suffix_and_deep_nesting(tmp_path):
    path = tmp_path / "deep.htm"
    path.write_text("<div>" * 3000 + "deep text" + "</div>" * 3000)
    assert read_document(path) == "deep text"


def test_read_pdf_extracts_text_of_every_page(tmp_path):
    path = tmp_path / "paper.pdf"
    path.write_bytes(make_pdf(["Hello from page one", "Second page (with parens)"]))
    assert read_document(path) == "Hello from page one\n\nSecond page (with parens)"


def test_read_pdf_without_text_suggests_ocr(tmp_path):
    path = tmp_path / "scan.pdf"
    path.write_bytes(make_pdf([""]))
    with pytest.raises(DocumentError, match=r"scan\.pdf: .*no extractable text.*OCR"):
        read_document(path)


def test_read_corrupted_pdf(tmp_path):
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"%PDF-1.4\nthis is not really a pdf\n")
    with pytest.raises(DocumentError, match=r"broken\.pdf: cannot read PDF .*corrupted"):
        read_document(path)


def test_read_binary_file_reports_offset(tmp_path):
    path = tmp_path / "blob.txt"
    path.write_bytes(b"abc\x00\x01\x02")
    with pytest.raises(DocumentError, match=r"blob\.txt: binary content \(NUL byte at offset 3\).*UTF-8"):
        read_document(path)


def test_read_non_utf8_reports_byte_and_offset(tmp_path):
    path = tmp_path / "latin.md"
    path.write_bytes("naïve".encode("latin-1"))
    expected = r"latin\.md: not valid UTF-8 \(byte 0xef at offset 2\); convert it to UTF-8"
    with pytest.raises(DocumentError, match=expected):
        read_document(path)


def test_read_non_utf8_offset_counts_the_bom(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbfab\xffc")
    with pytest.raises(DocumentError, match=r"bom\.txt: not valid UTF-8 \(byte 0xff at offset 5\)"):
        read_document(path)


@pytest.mark.parametrize(("name", "content"), [("empty.txt", b""), ("blank.md", b" \n\t\r\n"),
                                               ("empty.html", b"<html><script>x()</script></html>")])
def test_read_empty_document(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DocumentError, match=rf"{name}: no text"):
        read_document(path)


def test_read_unreadable_file(tmp_path, monkeypatch):
    path = tmp_path / "secret.txt"
    path.write_text("x")

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    # chmod would not stop root (tests may run as root), so simulate the operating system's refusal.
    monkeypatch.setattr(Path, "read_bytes", denied)
    expected = r"secret\.txt: cannot read \(Permission denied\); check the file's permissions"
    with pytest.raises(DocumentError, match=expected):
        read_document(path)


def test_read_unsupported_suffix(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("a,b")
    with pytest.raises(DocumentError, match=r"data\.csv: unsupported file type"):
        read_document(path)


def test_errors_are_one_line(tmp_path):
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"garbage\n\nmore garbage")
    with pytest.raises(DocumentError) as error:
        read_document(path)
    assert "\n" not in str(error.value)


# --- chunk_text --------------------------------------------------------------------------------

COUNTERS = {
    "whitespace": whitespace_counter,
    "bytes": byte_counter,
    "newline-costly": newline_costly_counter,
    "bpe": None,  # built lazily: it needs the optional tokenizers package
}


@pytest.mark.parametrize("max_tokens", [3, 7, 40, 300])
@pytest.mark.parametrize("counter_name", list(COUNTERS))
def test_chunk_invariants(counter_name, max_tokens):
    count = COUNTERS[counter_name] or bpe_counter()
    text = long_text()
    chunks = chunk_text(text, count, max_tokens)
    assert_valid_chunks(text, chunks, count, max_tokens)


def test_chunks_pack_whole_paragraphs_greedily():
    text = "one two three.\n\nfour five six.\n\nseven eight nine."
    chunks = chunk_text(text, whitespace_counter, 6)
    assert [c.text for c in chunks] == ["one two three.\n\nfour five six.", "seven eight nine."]


def test_long_paragraph_splits_at_sentences_then_words():
    text = "Alpha beta gamma. Delta epsilon! Zeta eta theta iota kappa lambda mu? Nu."
    chunks = chunk_text(text, whitespace_counter, 4)
    assert [c.text for c in chunks] == [
        "Alpha beta gamma.", "Delta epsilon!", "Zeta eta theta iota", "kappa lambda mu?", "Nu.",
    ]


def test_over_long_word_is_split_by_characters():
    word = "x" * 1000
    text = f"short start\n\n{word}\n\nshort end"
    chunks = chunk_text(text, byte_counter, 10)
    assert_valid_chunks(text, chunks, byte_counter, 10)
    pieces = [c for c in chunks if "x" in c.text]
    assert "".join(c.text for c in pieces) == word
    assert all(byte_counter(c.text) <= 10 for c in pieces)
    # Character splitting should fill each piece, not dribble out tiny ones.
    assert len(pieces) <= 1000 // 36 + 1


def test_tokenizer_merge_over_budget_falls_back_to_fewer_pieces():
    # Pieces count 1 each, but every line break costs 3: the sum says 3 lines fit in 3 tokens; they don't.
    text = "a\nb\nc\nd"
    chunks = chunk_text(text, newline_costly_counter, 5)
    assert [c.text for c in chunks] == ["a\nb", "c\nd"]


def test_count_tokens_is_not_called_quadratically():
    text = long_text()
    seen = []

    def counting(s: str) -> int:
        seen.append(len(s))
        return whitespace_counter(s)

    chunks = chunk_text(text, counting, 50)
    assert_valid_chunks(text, chunks, whitespace_counter, 50)
    assert sum(seen) <= 5 * len(text)
    assert len(seen) <= len(text.split()) + 3 * len(chunks)


def test_empty_text_gives_no_chunks():
    assert chunk_text(" \n\n\t ", whitespace_counter, 10) == []


def test_budget_smaller_than_one_character_is_an_error():
    with pytest.raises(CagkitError, match="chunk size 1 is too small"):
        chunk_text("abc", lambda s: len(s) + 1, 1)
    with pytest.raises(CagkitError, match="chunk size 0 is too small"):
        chunk_text("abc", whitespace_counter, 0)
