"""Find documents and read their text: plain text, Markdown, reStructuredText, HTML and PDF.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

import bs4
import pypdf

from cagkit.errors import CagkitError, DocumentError, SkippedDocumentWarning

SUPPORTED_SUFFIXES: frozenset[str] = frozenset({".txt", ".md", ".rst", ".html", ".htm", ".pdf"})

_TEXT_SUFFIXES = frozenset({".txt", ".md", ".rst"})
_HTML_SUFFIXES = frozenset({".html", ".htm"})


def _supported_list() -> str:
    """The supported suffixes, for error messages."""
    return ", ".join(sorted(SUPPORTED_SUFFIXES))


# --- finding documents -------------------------------------------------------------------------


def document_path(file: str | Path) -> str:
    """The name a document file is stored under: its absolute path with its folders resolved but its own name
    kept, so that a file symlinked into a folder is stored in that folder (and `cagkit store remove FOLDER`
    drops it) rather than under its target's path."""
    file = Path(file).expanduser().absolute()
    return str(file.parent.resolve() / file.name)


def find_documents(paths: Iterable[str | Path], skipped: list[tuple[str, str]] | None = None) -> list[Path]:
    """Expand files and folders (recursively) into a sorted list of supported files, skipping hidden ones.

    Symbolic links inside a folder that are not read are reported, each with a SkippedDocumentWarning and, when
    `skipped` is given, a (path, reason) appended to it: a link to a folder (not followed, so a walk can neither
    loop nor leave the folder), a broken link and a link loop. A link to a supported file is read, and stored
    under the link's own path (`document_path`)."""
    names: list[str] = []
    found: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        names.append(str(raw))
        if not path.exists():
            raise CagkitError(_missing(raw, path))
        if path.is_dir():
            found.update(_walk(path, skipped))
        elif path.suffix.lower() in SUPPORTED_SUFFIXES:
            found.add(path)
        else:
            suffix = path.suffix or "no suffix"
            raise CagkitError(
                f"{raw}: unsupported file type ({suffix}); supported: {_supported_list()}; "
                "convert it or leave it out"
            )
    if not found:
        where = ", ".join(names) or "(no paths given)"
        raise CagkitError(
            f"no supported documents found in {where}; supported: {_supported_list()}; "
            "point at files or folders that contain some"
        )
    return sorted(found)


def _missing(raw, path: Path) -> str:
    """Why `path` cannot be read, for a path that does not exist: a symbolic link loop, a broken link, or nothing."""
    return f"{raw}: {_broken_link(path) or 'no such file or folder; check the path'}"


def _broken_link(path: Path) -> str | None:
    """Why a symbolic link cannot be followed (a loop, or a link to nothing), with the fix; None otherwise."""
    import errno

    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop (following it leads back to itself); point at the real file or folder"
    if path.is_symlink() and not path.exists():
        return f"a broken symbolic link (to {os.readlink(path)}, which does not exist); fix the link or the path"
    return None


def _walk(root: Path, skipped: list[tuple[str, str]] | None = None) -> list[Path]:
    """Supported files under root; hidden names below root are skipped, symlinked folders not followed (each
    link not read is reported: `find_documents`)."""
    files = []
    for folder, dirnames, filenames in os.walk(root, onerror=_walk_error):
        # Pruning in place stops os.walk from descending into hidden folders (.git, .venv, ...).
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in dirnames:
            path = Path(folder, name)
            if path.is_symlink():  # os.walk lists it and, not following links, never enters it
                _skip(skipped, path, f"a symbolic link to a folder ({os.readlink(path)}), not followed inside a "
                                     f"folder; ingest its target as a path of its own")
        for name in filenames:
            path = Path(folder, name)
            if name.startswith("."):
                continue
            broken = _broken_link(path) if path.is_symlink() else None
            if broken:  # whatever its name: it may stand for a folder
                _skip(skipped, path, broken)
            elif path.suffix.lower() in SUPPORTED_SUFFIXES and path.is_file():
                files.append(path)
    return files


def _skip(skipped: list[tuple[str, str]] | None, path: Path, reason: str) -> None:
    """Report a path `find_documents` does not read: a warning, and a (path, reason) in `skipped`."""
    warnings.warn(f"{path}: {reason}", SkippedDocumentWarning, stacklevel=4)
    if skipped is not None:
        skipped.append((str(path), reason))


def _walk_error(error: OSError) -> None:
    """Fail loudly: silently skipping an unreadable folder would drop documents without a word."""
    raise CagkitError(f"{error.filename}: cannot list folder ({error.strerror}); check its permissions")


# --- reading documents -------------------------------------------------------------------------


def read_document(path: Path) -> str:
    """Return the document's text with line endings normalised to \\n."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise DocumentError(f"{path}: unsupported file type ({suffix or 'no suffix'}); supported: {_supported_list()}")
    data = _read_bytes(path)
    if suffix in _TEXT_SUFFIXES:
        text = _decode_text(path, data)
    elif suffix in _HTML_SUFFIXES:
        text = _html_text(path, data)
    else:
        text = _pdf_text(path, data)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise DocumentError(f"{path}: no text (empty or whitespace only); add content or leave the file out")
    return text


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, or a DocumentError saying why they cannot be read."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise DocumentError(f"{path}: cannot read ({error.strerror}); check the file's permissions") from error


def _decode_text(path: Path, data: bytes) -> str:
    """Decode strict UTF-8, allowing a BOM; offsets in errors are byte offsets into the file."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise DocumentError(
            f"{path}: binary content (NUL byte at offset {nul}); "
            "if it is text (e.g. UTF-16), convert it to UTF-8, otherwise leave it out"
        )
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as error:
        offset = skip + error.start
        raise DocumentError(
            f"{path}: not valid UTF-8 (byte 0x{data[offset]:02x} at offset {offset}); "
            "convert it to UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from error


# Elements whose text a reader never sees (bs4 already types script/style strings apart; be explicit anyway).
_HTML_HIDDEN = frozenset({"script", "style", "template", "noscript"})
# Elements that start a new paragraph (blank line) or a new line.
_HTML_PARAGRAPH = frozenset(
    "address article aside blockquote body details dialog div dl fieldset figcaption figure footer form "
    "h1 h2 h3 h4 h5 h6 header hr html main nav ol p pre section summary table title ul".split()
)
_HTML_LINE = frozenset({"caption", "dd", "dt", "li", "tr"})
_HTML_CELL = frozenset({"td", "th"})
# HTML's own whitespace; a non-breaking space is content, not layout.
_HTML_SPACE = re.compile(r"[ \t\n\r\f]+")


def _html_text(path: Path, data: bytes) -> str:
    """Visible text of an HTML page, block elements separated by line breaks."""
    with warnings.catch_warnings():
        # The markup comes from a file, so bs4's "this looks like a filename/URL/XML" hints are noise.
        warnings.simplefilter("ignore", bs4.MarkupResemblesLocatorWarning)
        warnings.simplefilter("ignore", bs4.XMLParsedAsHTMLWarning)
        try:
            soup = bs4.BeautifulSoup(data, "html.parser")
        except bs4.ParserRejectedMarkup as error:
            raise DocumentError(f"{path}: cannot parse HTML ({_one_line(error)}); fix or re-save the file") from error
    builder = _TextBuilder()
    # An explicit stack, not recursion: deeply nested markup must not hit Python's recursion limit.
    stack: list[object] = list(reversed(soup.contents))
    while stack:
        node = stack.pop()
        if isinstance(node, int):
            builder.newlines(node)
        elif isinstance(node, _PreEnd):
            builder.pre_depth -= 1
        elif isinstance(node, bs4.Tag):
            stack.extend(_html_open(node, builder))
        elif type(node) is bs4.NavigableString:  # subclasses are comments, CDATA, doctypes...
            builder.add(str(node))
    return re.sub(r"\n{3,}", "\n\n", builder.text()).strip()


class _PreEnd:
    """Stack marker: the end of a <pre> element."""


def _html_open(tag: bs4.Tag, builder: _TextBuilder) -> list[object]:
    """Apply a tag's opening break; return what to push: its closing markers, then its children reversed."""
    name = tag.name
    if name in _HTML_HIDDEN:
        return []
    if name == "br":
        builder.newlines(1)
        return []
    if name in _HTML_CELL:
        builder.add(" ")
    breaks = 2 if name in _HTML_PARAGRAPH else 1 if name in _HTML_LINE else 0
    builder.newlines(breaks)
    closing: list[object] = [breaks] if breaks else []
    if name == "pre":
        builder.pre_depth += 1
        closing.append(_PreEnd())
    return closing + list(reversed(tag.contents))


class _TextBuilder:
    """Joins text pieces, collapsing HTML whitespace outside <pre> and merging requested line breaks."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.pending = 0
        self.pre_depth = 0

    def newlines(self, count: int) -> None:
        """Ask for at least count newlines before the next text."""
        self.pending = max(self.pending, count)

    def add(self, text: str) -> None:
        """Append text, collapsing whitespace unless inside <pre>."""
        pre = self.pre_depth > 0
        if not pre:
            text = _HTML_SPACE.sub(" ", text)
        if self.pending and self.parts:
            self._trim_trailing_spaces()
            self.parts.append("\n" * self.pending)
        self.pending = 0
        if not pre and (not self.parts or self.parts[-1].endswith((" ", "\n"))):
            text = text.lstrip(" ")
        if text:
            self.parts.append(text)

    def _trim_trailing_spaces(self) -> None:
        """Drop spaces before a line break."""
        while self.parts:
            self.parts[-1] = self.parts[-1].rstrip(" ")
            if self.parts[-1]:
                return
            self.parts.pop()

    def text(self) -> str:
        """Everything added so far."""
        return "".join(self.parts)


def _pdf_text(path: Path, data: bytes) -> str:
    """Text of every page, pages separated by blank lines."""
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(f"{path}: PDF is password-protected; decrypt it first (e.g. qpdf --decrypt)")
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except DocumentError:
        raise
    except Exception as error:
        # pypdf raises many exception types on damaged files; any of them means "cannot read this PDF".
        raise DocumentError(
            f"{path}: cannot read PDF ({type(error).__name__}: {_one_line(error)}); "
            "the file may be corrupted, re-export or repair it"
        ) from error
    text = "\n\n".join(page for page in pages if page)
    if not text:
        raise DocumentError(f"{path}: PDF has no extractable text (scanned PDF?); run OCR first, e.g. ocrmypdf")
    return text


def _one_line(error: Exception) -> str:
    """An exception's message squeezed onto one line."""
    return " ".join(str(error).split()) or "no details"


# --- chunking ----------------------------------------------------------------------------------
