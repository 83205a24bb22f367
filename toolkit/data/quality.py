"""Document quality filters after Gopher (Rae et al. 2021, "Scaling Language Models", Appendix A: MassiveText
quality filtering and repetition removal).

Three heuristics, each with its own threshold and drop count:

- length: Gopher keeps documents of 50 to 100,000 words. Our default minimum is 5 because the demo corpus
  (toolkit/data/corpus.py) has 8-word code snippets, and `make demo` must keep them; raise it for web text.
- symbols: Gopher drops documents with more than 0.1 `#` or `...` per word. We measure the broader ratio of
  non-alphanumeric, non-space characters to alphabetic ones, which also catches tables of numbers, ASCII
  art and minified data; code sits near 0.5, so the default limit is 1.0.
- repetition: the share of characters inside word n-grams that occur more than once in the document,
  each character counted once. Gopher drops a document above 0.15 for n=5 (and stricter limits for larger
  n, which a 5-gram test already implies for most text), so the defaults are n=5 and 0.15. It is measured
  only on documents of at least 50 words: Gopher set its thresholds on documents its length filter had
  already cut to 50 words or more, and in a 20-word text one repeated sentence (the demo's books domain
  has them) is over 0.15 without being boilerplate.

Words are the lower-cased, whitespace-separated tokens of the UTF-8 bytes; lengths are in bytes. The word
and n-gram hashes here (CRC-32 per word, combined in uint64 arithmetic) are also the shingles of the
near-duplicate filter, so both see the same words.
"""

from __future__ import annotations

import re
import string
import zlib
from typing import Literal

import numpy as np

from toolkit.data.options import QualityFilter

Reason = Literal["too_few_words", "too_many_words", "symbol_ratio", "repetition"]
REASONS: tuple[Reason, ...] = ("too_few_words", "too_many_words", "symbol_ratio", "repetition")

_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio): a bijective multiply step
_ASCII_LETTERS = string.ascii_letters.encode()
_ASCII_ALNUM_SPACE = (string.ascii_letters + string.digits + string.whitespace).encode()
_ALPHA = re.compile(r"[^\W\d_]")
_SYMBOL = re.compile(r"[^\w\s]|_")


def quality_reason(
    limits: QualityFilter, text: str, words: list[bytes], hashes: np.ndarray | None = None
) -> Reason | None:
    """Why `text` (with `words` = `words_of(text)`, `hashes` = `word_hashes(words)`) is dropped, or None to
    keep it; a document failing several filters is counted under the first in `REASONS`."""
    if len(words) < limits.min_words:
        return "too_few_words"
    if len(words) > limits.max_words:
        return "too_many_words"
    if symbol_ratio(text) > limits.max_symbol_ratio:
        return "symbol_ratio"
    if (
        len(words) >= limits.repetition_min_words
        and duplicate_ngram_fraction(words, limits.repetition_ngram, hashes) > limits.max_repetition
    ):
        return "repetition"
    return None


def words_of(text: str) -> list[bytes]:
    return text.lower().encode("utf-8").split()


def symbol_ratio(text: str) -> float:
    """Non-alphanumeric, non-space characters per alphabetic character (inf when there are no letters)."""
    if text.isascii():  # bytes.translate deletes in C: ~50x faster than a regex on the common case
        raw = text.encode()
        alpha = len(raw) - len(raw.translate(None, _ASCII_LETTERS))
        symbols = len(raw.translate(None, _ASCII_ALNUM_SPACE))
    else:
        alpha, symbols = len(_ALPHA.findall(text)), len(_SYMBOL.findall(text))
    return symbols / alpha if alpha else (float("inf") if symbols else 0.0)


def word_hashes(words: list[bytes]) -> np.ndarray:
    return np.fromiter(map(zlib.crc32, words), dtype=np.uint64, count=len(words))


def ngram_hashes(hashes: np.ndarray, n: int) -> np.ndarray:
    """One 64-bit hash per word n-gram (len(hashes) - n + 1 of them; none when there are fewer than n words)."""
    count = len(hashes) - n + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    acc = np.zeros(count, dtype=np.uint64)
    for j in range(n):
        acc = acc * _MULT + hashes[j : j + count]
    return fmix64(acc)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: a bijection that spreads every input bit over the output."""
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def duplicate_ngram_fraction(words: list[bytes], n: int, hashes: np.ndarray | None = None) -> float:
    """Share of the word bytes covered by word n-grams occurring more than once (Gopher's "duplicate n-gram
    character fraction"); every byte counted once however many repeated n-grams cover it."""
    grams = ngram_hashes(word_hashes(words) if hashes is None else hashes, n)
    if len(grams) < 2:
        return 0.0
    _, inverse, counts = np.unique(grams, return_inverse=True, return_counts=True)
    repeated = counts[inverse] > 1
    if not repeated.any():
        return 0.0
    covered = np.convolve(repeated.astype(np.int32), np.ones(n, dtype=np.int32))[: len(words)] > 0
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    return float(lengths[covered].sum() / lengths.sum())


def language_allowed(lang: str | None, allowed: tuple[str, ...]) -> bool | None:
    """True/False for a tagged document; None for one without a tag (kept, and counted as untagged)."""
    return None if lang is None else lang in allowed
