"""Token ids of every kept document on disk, so packing can visit documents in any order without holding them.

One flat int32 file per tokenize task (toolkit.data.task_tokens) and one length per document in memory (4
bytes; offsets are their running sum), the tasks' documents addressed as one sequence in task order. Reads use
`os.pread`, not `mmap`: pages of a mapped file count in the process's resident set, which would then grow with
the corpus, while pread goes through the page cache the kernel can drop.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np


class TokenShards:
    def __init__(self, paths: list[Path], lengths: list[np.ndarray]) -> None:
        self.paths = paths
        self.lengths = np.concatenate(lengths).astype(np.int32) if lengths else np.zeros(0, np.int32)
        """Tokens per document (without the end-of-text separator), in task order."""
        self._file = np.repeat(np.arange(len(paths), dtype=np.int32), [len(x) for x in lengths])
        starts = [np.concatenate([[0], np.cumsum(x, dtype=np.int64)[:-1]]) for x in lengths if len(x)]
        self._start = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        """Each document's first token within its file."""

    def __len__(self) -> int:
        return len(self.lengths)

    def documents(self, order: Iterable[int]) -> Iterator[np.ndarray]:
        """The token ids of documents `order`, one array each."""
        fds = [os.open(p, os.O_RDONLY) for p in self.paths]
        try:
            for i in order:
                n, start = int(self.lengths[i]), int(self._start[i])
                yield np.frombuffer(os.pread(fds[self._file[i]], n * 4, start * 4), dtype=np.int32)
        finally:
            for fd in fds:
                os.close(fd)
