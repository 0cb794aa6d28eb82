"""Cut a document's text into chunks that fit a token budget: whole paragraphs packed greedily, a paragraph
too long split at sentences, a sentence at words, a word at characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from cagkit.config import DEFAULT_CHUNK_TOKENS
from cagkit.errors import CagkitError


@dataclass(frozen=True)
class Chunk:
    """A piece of a document: text == document_text[char_start:char_end]."""

    text: str
    char_start: int
    char_end: int


MIN_CHUNK_TOKENS = 16
_MAX_TOKEN_CHARS = 64  # more characters per token, on average over a piece, than any tokenizer gives


def check_chunk_tokens(chunk_tokens: int) -> None:
    """Refuse a chunk size too small to hold a sentence, before anything is written."""
    if chunk_tokens < MIN_CHUNK_TOKENS:
        raise CagkitError(f"--chunk-tokens must be at least {MIN_CHUNK_TOKENS}, got {chunk_tokens}; "
                          f"the default is {DEFAULT_CHUNK_TOKENS}")


def chunk_text(text: str, count_tokens: Callable[[str], int], max_tokens: int,
               token_ends: Callable[[str], list[int]] | None = None) -> list[Chunk]:
    """Split text into ordered, non-overlapping chunks of at most max_tokens tokens each.

    Whole paragraphs are packed greedily; a paragraph too long is split at sentences, a sentence at
    words, a word at characters. Chunks never start or end with whitespace. `token_ends` (the character offset
    where each token of a string ends) lets a word too long for one chunk be cut at a token boundary with two
    tokenizer calls per chunk; without it the cut is searched for with `count_tokens`. Either way the time is
    linear in the text's length: a piece longer than `max_tokens` tokens could possibly be is never counted whole.
    """
    if max_tokens < 1:
        raise CagkitError(f"chunk size {max_tokens} is too small; use at least 1 token")
    chunker = _Chunker(text, count_tokens, max_tokens, token_ends)
    return chunker.pack(chunker.pieces((0, len(text)), _SEPARATORS[0]), 0)


Span = tuple[int, int]

# Separators, from coarsest to finest. A separator is the last group that matched, or the whole match.
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")
# After sentence punctuation (and closing quotes/brackets) or at a line break; CJK full stops need no space.
_SENTENCE_BREAK = re.compile(r"[.!?…][\"'”’)\]]*(\s+)|[。！？](\s*)|([^\S\n]*\n\s*)")
_WORD_BREAK = re.compile(r"\s+")
_SEPARATORS = (_PARAGRAPH_BREAK, _SENTENCE_BREAK, _WORD_BREAK)


def sentence_spans(text: str) -> list[Span]:
    """Character spans of `text`'s sentences, split where the chunker splits sentences (after . ! ? … and closing
    quotes, after CJK full stops, at line breaks), whitespace trimmed, in order."""
    return _Chunker(text, len, 1).pieces((0, len(text)), _SENTENCE_BREAK)


class _Chunker:
    """Packs pieces of one text into chunks under a token budget."""

    def __init__(self, text: str, count_tokens: Callable[[str], int], max_tokens: int,
                 token_ends: Callable[[str], list[int]] | None = None) -> None:
        self.text = text
        self.count_tokens = count_tokens
        self.max_tokens = max_tokens
        self.token_ends = token_ends
        # Longer pieces are over budget without counting: no tokenizer's tokens average this many characters, and
        # counting a 2 MB line whole at each level of splitting is what made such a line take minutes.
        self.count_limit = max(_MAX_TOKEN_CHARS * max_tokens, 1 << 16)

    def fits(self, start: int, end: int) -> bool:
        """Whether text[start:end] is within the budget (one tokenizer call)."""
        return self.count_tokens(self.text[start:end]) <= self.max_tokens

    def split(self, span: Span, level: int) -> list[Chunk]:
        """Chunks for a span too long to be one: split at separator `level`, or finer if that yields one piece."""
        while level < len(_SEPARATORS):
            pieces = self.pieces(span, _SEPARATORS[level])
            if len(pieces) > 1:
                return self.pack(pieces, level)
            level += 1
        return self.split_characters(span)

    def pieces(self, span: Span, separator: re.Pattern[str]) -> list[Span]:
        """Non-empty spans between separator matches, with surrounding whitespace trimmed."""
        spans = []
        position = span[0]
        for match in separator.finditer(self.text, span[0], span[1]):
            gap_start, gap_end = match.span(match.lastindex or 0)
            spans.append(self.strip(position, gap_start))
            position = gap_end
        spans.append(self.strip(position, span[1]))
        return [(start, end) for start, end in spans if start < end]

    def strip(self, start: int, end: int) -> Span:
        """The span without leading and trailing whitespace."""
        piece = self.text[start:end]
        return start + len(piece) - len(piece.lstrip()), end - len(piece) + len(piece.rstrip())

    def pack(self, pieces: list[Span], level: int) -> list[Chunk]:
        """Greedily pack consecutive pieces into chunks; pieces too long on their own are split finer."""
        # Count each piece once; a packed chunk's estimate is the sum, checked by one call in fitting_prefix.
        counts = [self.count_tokens(self.text[start:end]) if end - start <= self.count_limit else self.max_tokens + 1
                  for start, end in pieces]
        chunks: list[Chunk] = []
        i = 0
        while i < len(pieces):
            if counts[i] > self.max_tokens:
                chunks.extend(self.split(pieces[i], level + 1))
                i += 1
                continue
            j, total = i, 0
            while j < len(pieces) and total + counts[j] <= self.max_tokens:
                total += counts[j]
                j += 1
            k = self.fitting_prefix(pieces, i, j)
            chunks.append(self.chunk(pieces[i][0], pieces[k - 1][1]))
            i = k
        return chunks

    def fitting_prefix(self, pieces: list[Span], i: int, j: int) -> int:
        """Largest k in (i, j] such that pieces[i:k] fit together; pieces[i] alone is known to fit."""
        if j - i == 1 or self.fits(pieces[i][0], pieces[j - 1][1]):
            return j
        # The separators or a tokenizer merge pushed the sum over budget: binary search the longest prefix.
        good, bad = i + 1, j
        while bad - good > 1:
            middle = (good + bad) // 2
            if self.fits(pieces[i][0], pieces[middle - 1][1]):
                good = middle
            else:
                bad = middle
        return good

    def split_characters(self, span: Span) -> list[Chunk]:
        """Cut a single over-long word into the longest runs of characters that fit."""
        chunks = []
        start, end = span
        while start < end:
            stop = self.longest_fit(start, end)
            chunks.append(self.chunk(start, stop))
            start = stop
        return chunks

    def longest_fit(self, start: int, end: int) -> int:
        """Largest stop in (start, end] with text[start:stop] within budget.

        Gallops from max_tokens characters, then bisects, so each call counts a string of roughly chunk size
        rather than the whole (possibly huge) word.
        """
        if not self.fits(start, start + 1):
            raise CagkitError(
                f"chunk size {self.max_tokens} is too small: the character {self.text[start]!r} alone "
                "is over it; use a larger chunk size"
            )
        if self.token_ends is not None:
            stop = self.cut_at_tokens(start, end)
            if stop is not None:
                return stop
        good, bad = start + 1, end + 1  # end + 1: nothing has failed yet
        probe = min(end, start + max(2, self.max_tokens))
        while probe > good:
            if not self.fits(start, probe):
                bad = probe
                break
            good = probe
            probe = min(end, start + 2 * (probe - start))
        while bad - good > 1:
            middle = (good + bad) // 2
            if self.fits(start, middle):
                good = middle
            else:
                bad = middle
        return good

    def cut_at_tokens(self, start: int, end: int) -> int | None:
        """The end of the longest run of whole tokens from `start` that fits, found by tokenizing a window a little
        longer than a chunk; None when no cut near the budget fits alone (the caller searches then)."""
        window = 8 * self.max_tokens
        while True:
            stop = min(end, start + window)
            ends = [e for e in self.token_ends(self.text[start:stop]) if e > 0]
            if len(ends) > self.max_tokens or stop == end:
                break
            window *= 4
        if len(ends) <= self.max_tokens:  # the rest of the span is one chunk
            return end if self.fits(start, end) else None
        # The prefix's own tokens can differ from the window's at the cut: back off a few tokens if it is over.
        for k in range(self.max_tokens, max(self.max_tokens - 8, 0), -1):
            cut = start + ends[k - 1]
            if start < cut <= end and self.fits(start, cut):
                return cut
        return None

    def chunk(self, start: int, end: int) -> Chunk:
        """The chunk covering text[start:end]."""
        return Chunk(self.text[start:end], start, end)
