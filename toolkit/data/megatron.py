"""Megatron-LM's indexed dataset (`MMapIndexedDataset`, .bin/.idx), written document by document: what
`--data-path PREFIX` of Megatron-LM and Megatron-DeepSpeed reads.

The layout (version 1, little-endian), as Megatron's reader parses it:

- PREFIX.bin: the token ids of every sequence back to back, in the index's dtype, no header.
- PREFIX.idx: magic `MMIDIDX\\x00\\x00` (9 bytes); version (uint64, 1); dtype code (uint8: 4 int32, 8 uint16);
  N, the number of sequences (uint64); D+1, the length of doc_idx (uint64); sizes (int32 × N, tokens per
  sequence); pointers (int64 × N, byte offset of each sequence in .bin: the exclusive running sum of
  size × itemsize); doc_idx (int64 × (D+1), the sequence at which each document starts, then N).

Here every document is one sequence ending with the end-of-text token (what `preprocess_data.py
--append-eod` means), so doc_idx is 0..N and each size counts the EOD — the sizes are taken from the arrays
actually written (NVIDIA/Megatron-LM#431 shows what goes wrong when they are not). The dtype is Megatron's
own choice: uint16 when the vocabulary has fewer than 65,500 entries, else int32.
"""

from __future__ import annotations

import struct
from array import array
from pathlib import Path

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}
SMALL_VOCAB = 65_500


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < SMALL_VOCAB else np.int32)


class MegatronWriter:
    """`add` each document's ids (the EOD is appended here), then `close` to write the index."""

    def __init__(self, prefix: Path, vocab_size: int, eod: int) -> None:
        self.prefix, self.dtype, self.eod = prefix, token_dtype(vocab_size), eod
        prefix.parent.mkdir(parents=True, exist_ok=True)
        self._bin = open(f"{prefix}.bin", "wb")  # noqa: SIM115 - closed in close()
        self._sizes = array("i")
        self.tokens = 0

    def add(self, ids: np.ndarray) -> None:
        doc = np.empty(len(ids) + 1, dtype=self.dtype)
        doc[:-1], doc[-1] = ids, self.eod
        self._bin.write(doc.tobytes())
        self._sizes.append(len(doc))
        self.tokens += len(doc)

    def close(self) -> int:
        """Write PREFIX.idx; returns the number of documents."""
        self._bin.close()
        sizes = np.frombuffer(self._sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        np.cumsum(sizes[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        with open(f"{self.prefix}.idx", "wb") as f:
            f.write(
                MAGIC + struct.pack("<QBQQ", VERSION, DTYPE_CODES[self.dtype], len(sizes), len(sizes) + 1)
            )
            f.write(sizes.astype("<i4").tobytes())
            f.write(pointers.astype("<i8").tobytes())
            f.write(np.arange(len(sizes) + 1, dtype="<i8").tobytes())
        return len(sizes)
