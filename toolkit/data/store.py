"""Token ids of every kept document on disk, so packing can visit documents in any order without holding them.

One flat int32 file plus one length per document in memory (4 bytes; offsets are their running sum). Reads
use `os.pread`, not `mmap`: pages of a mapped file count in the process's resident set, which would then grow
with the corpus, while pread goes through the page cache the kernel can drop.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path

import numpy as np


class TokenStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lengths = array("i")
        self._out = path.open("wb")
        self._offsets: np.ndarray | None = None
        self.lengths = np.zeros(0, dtype=np.int32)
        """Tokens per document (without the end-of-text separator), in append order; set by finish()."""

    def append(self, documents: list[list[int]]) -> None:
        sizes = [len(ids) for ids in documents]
        flat = np.fromiter(chain.from_iterable(documents), dtype=np.int32, count=sum(sizes))
        self._out.write(flat.tobytes())
        self._lengths.extend(sizes)

    def finish(self) -> None:
        self._out.close()
        self.lengths = np.array(self._lengths, dtype=np.int32)
        self._offsets = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])

    def __len__(self) -> int:
        return len(self._lengths)

    def documents(self, order: Iterable[int]) -> Iterator[np.ndarray]:
        """The token ids of documents `order`, one array each."""
        assert self._offsets is not None, "finish() first"
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i in order:
                start, end = self._offsets[i], self._offsets[i + 1]
                yield np.frombuffer(os.pread(fd, int(end - start) * 4, int(start) * 4), dtype=np.int32)
        finally:
            os.close(fd)
