"""Exact and near-duplicate removal, streaming, with an index of a few dozen bytes per document.

Exact: a 64-bit BLAKE2b hash of the cleaned text; a document whose hash was seen before is dropped.

Near: MinHash signatures (datasketch `MinHash.bulk`, the affine32 permutation scheme) over the set of word
`shingle_size`-grams, cut into b bands of r rows with the (b, r) that datasketch's `MinHashLSH` chooses for
the Jaccard threshold (minimum of false-positive plus false-negative probability mass; Leskovec, Rajaraman &
Ullman, *Mining of Massive Datasets*, §3.4). A document is dropped when any of its bands equals a band of an
earlier document, so each connected component of near-duplicates keeps its first member (the rule of the
BigCode/`text-dedup` pipelines). Candidates are not verified against the estimated Jaccard: at the defaults
(128 permutations, threshold 0.8 → b=9, r=13) a pair at J=0.5 collides with probability 0.1 %.

The index is ours, not `MinHashLSH`: that class keeps a Python dict of sets per band, ~3.2 KB per document
at the defaults (measured with tracemalloc on 20,000 signatures), which is what a 1 GB corpus cannot
afford. Here each band is one 64-bit hash in sorted numpy segments (`HashSet`): b × 8 bytes per new
document, and documents are checked in batches with vectorised lookups.
"""

from __future__ import annotations

import hashlib

import numpy as np

from toolkit.data.options import DedupOptions
from toolkit.data.quality import fmix64, ngram_hashes

KEEP, EXACT, NEAR = 0, 1, 2
_MULT = np.uint64(0xD6E8FEB86659FD93)
_FOLD32 = np.uint64(0xFFFFFFFF)


class HashSet:
    """A set of uint64 in sorted numpy segments, merged like a binary counter (O(log n) segments, amortised
    O(n log n) work); 8 bytes per element instead of ~70 for a Python set of ints."""

    def __init__(self) -> None:
        self._segments: list[np.ndarray] = []

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._segments)

    def __len__(self) -> int:
        return sum(len(s) for s in self._segments)

    def seen_and_add(self, keys: np.ndarray) -> np.ndarray:
        """For each key: was it in the set, or earlier in `keys`? Then add all of them."""
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        seen = first[inverse] != np.arange(len(keys))
        present = np.zeros(len(uniq), dtype=bool)
        for seg in self._segments:
            pos = np.minimum(np.searchsorted(seg, uniq), len(seg) - 1)
            present |= seg[pos] == uniq
        seen |= present[inverse]
        new = uniq[~present]
        if len(new):
            self._segments.append(new)
            while len(self._segments) > 1 and len(self._segments[-2]) <= 2 * len(self._segments[-1]):
                last = self._segments.pop()
                self._segments[-1] = np.sort(np.concatenate([self._segments[-1], last]))
        return seen


class Deduplicator:
    """`check(texts, shingles)` → KEEP, EXACT or NEAR per document, against every earlier document."""

    def __init__(self, options: DedupOptions) -> None:
        self.options = options
        self.exact = HashSet()
        self.near = HashSet()
        self.documents = 0
        if options.dedup == "near":
            from datasketch import MinHashLSH

            lsh = MinHashLSH(threshold=options.near_threshold, num_perm=options.num_perm)
            self.bands, self.rows = lsh.b, lsh.r
            salts = np.arange(1, self.bands + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            self._salts = fmix64(salts)

    @property
    def index_bytes(self) -> int:
        return self.exact.nbytes + self.near.nbytes

    def shingles(self, word_hashes: np.ndarray) -> np.ndarray | None:
        """The document's distinct 32-bit shingle hashes (word n-grams; the whole text when it is shorter),
        kept per document until its batch is checked; None unless near-duplicate removal is on."""
        if self.options.dedup != "near":
            return None
        h = ngram_hashes(word_hashes, max(1, min(self.options.shingle_size, len(word_hashes))))
        return np.unique(((h >> np.uint64(32)) ^ (h & _FOLD32)).astype(np.uint32))

    def check(self, texts: list[str], shingles: list[np.ndarray | None]) -> np.ndarray:
        """KEEP, EXACT or NEAR for each document (`shingles` from `self.shingles`), then index them."""
        codes = np.full(len(texts), KEEP, dtype=np.int8)
        if self.options.dedup == "none" or not texts:
            return codes
        self.documents += len(texts)
        digests = np.array(
            [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") for t in texts],
            dtype=np.uint64,
        )
        codes[self.exact.seen_and_add(digests)] = EXACT
        if self.options.dedup == "near":
            todo = np.flatnonzero(codes == KEEP)
            if len(todo):
                near = self._band_keys([shingles[i] for i in todo])
                codes[todo[self.near.seen_and_add(near.ravel()).reshape(len(todo), -1).any(axis=1)]] = NEAR
        return codes

    def _band_keys(self, shingles: list[np.ndarray]) -> np.ndarray:
        """(documents, bands) uint64: each band's r MinHash values hashed to one number, salted by band."""
        from datasketch import MinHash

        sketches = MinHash.bulk(
            (s.tolist() for s in shingles), num_perm=self.options.num_perm, seed=1, hashfunc=int
        )
        sig = np.stack([m.hashvalues for m in sketches]).astype(np.uint64)
        bands = sig[:, : self.bands * self.rows].reshape(len(shingles), self.bands, self.rows)
        acc = np.zeros((len(shingles), self.bands), dtype=np.uint64)
        for j in range(self.rows):
            acc = acc * _MULT + bands[:, :, j]
        return fmix64(acc ^ self._salts)
