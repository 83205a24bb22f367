"""Exact and near-duplicate removal in one process, streaming, with an index of a few dozen bytes per document.

Exact: a 64-bit BLAKE2b hash of the cleaned text; a document whose hash was seen before is dropped.

Near: MinHash signatures (toolkit.data.signatures: datasketch's affine32 scheme) over the set of word
`shingle_size`-grams, cut into b bands of r rows with the (b, r) that datasketch's `MinHashLSH` chooses for
the Jaccard threshold (minimum of false-positive plus false-negative probability mass; Leskovec, Rajaraman &
Ullman, *Mining of Massive Datasets*, §3.4). A document is dropped when any of its bands equals a band of an
earlier document (the rule of the BigCode/`text-dedup` pipelines). Candidates are not verified against the
estimated Jaccard: at the defaults (128 permutations, threshold 0.7 → b=14, r=9) a pair at J=0.5 collides
with probability 2.7 %.

The same rule runs across tasks and nodes in toolkit.data.task_dedup (the keys on disk, datatrove's bucket
merge finding the pairs); this module is the one-process form `filter_documents` uses.

The index is ours, not `MinHashLSH`: that class keeps a Python dict of sets per band, ~3.2 KB per document
at the defaults (measured with tracemalloc on 20,000 signatures). Here each band is one 64-bit hash in sorted
numpy segments (`HashSet`): b × 8 bytes per new document, and documents are checked in batches with
vectorised lookups.
"""

from __future__ import annotations

import numpy as np

from toolkit.data.options import DedupOptions
from toolkit.data.signatures import Signer, exact_keys

KEEP, EXACT, NEAR = 0, 1, 2


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
        self.signer = Signer(options) if options.dedup == "near" else None
        self.bands, self.rows = (self.signer.bands, self.signer.rows) if self.signer else (0, 0)

    @property
    def index_bytes(self) -> int:
        return self.exact.nbytes + self.near.nbytes

    def shingles(self, word_hashes: np.ndarray) -> np.ndarray | None:
        """The document's shingles, kept until its batch is checked; None unless near-duplicate removal is on."""
        return self.signer.shingles(word_hashes) if self.signer else None

    def check(self, texts: list[str], shingles: list[np.ndarray | None]) -> np.ndarray:
        """KEEP, EXACT or NEAR for each document (`shingles` from `self.shingles`), then index them."""
        codes = np.full(len(texts), KEEP, dtype=np.int8)
        if self.options.dedup == "none" or not texts:
            return codes
        self.documents += len(texts)
        codes[self.exact.seen_and_add(exact_keys(texts))] = EXACT
        if self.signer is not None:
            todo = np.flatnonzero(codes == KEEP)
            if len(todo):
                near = self.signer.band_keys([shingles[i] for i in todo])
                codes[todo[self.near.seen_and_add(near.ravel()).reshape(len(todo), -1).any(axis=1)]] = NEAR
        return codes
