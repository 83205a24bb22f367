"""Packing: documents joined by an end-of-text token and cut into rows of exactly `seq_length` tokens.

The last row of a split is padded (its real length is kept in `n_tokens`; the loader gives padding label
-100), so every token is trained on exactly once per epoch and nothing is truncated. Rows are built in numpy
chunks and written through `datasets`' ArrowWriter, then `save_to_disk` shards them (the output contract
dstk train reads with `load_from_disk`).

`--no-pack` (packing "none") keeps document boundaries instead, for token-budget batching: one row per
document with its end-of-text token, of variable length (an Arrow list column, no padding stored); a document
longer than `seq_length` is cut into pieces of `seq_length` (the last one shorter), so here too no token is
lost.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def pack_chunks(
    docs: Iterable[Sequence[int] | np.ndarray],
    seq_length: int,
    eos: int,
    pad: int,
    rows_per_chunk: int = 1024,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(rows, n_tokens) arrays of up to `rows_per_chunk` rows: documents joined by `eos`, cut every
    `seq_length` tokens; the final row padded with `pad`, its real length in n_tokens."""
    eos_arr = np.array([eos], dtype=np.int32)
    pending: list[np.ndarray] = []
    size = 0
    for ids in docs:
        pending += (np.asarray(ids, dtype=np.int32), eos_arr)
        size += len(ids) + 1
        if size >= seq_length * rows_per_chunk:
            flat = np.concatenate(pending)
            full = size - size % seq_length
            yield flat[:full].reshape(-1, seq_length), np.full(full // seq_length, seq_length, dtype=np.int32)
            pending, size = [flat[full:]], size - full
    if size:
        flat = np.concatenate(pending)
        full = size - size % seq_length
        rows, n_tokens = flat[:full].reshape(-1, seq_length), [seq_length] * (full // seq_length)
        if size > full:
            last = np.full((1, seq_length), pad, dtype=np.int32)
            last[0, : size - full] = flat[full:]
            rows, n_tokens = np.concatenate([rows, last]), [*n_tokens, size - full]
        yield rows, np.array(n_tokens, dtype=np.int32)


def piece_chunks(
    docs: Iterable[Sequence[int] | np.ndarray], seq_length: int, eos: int, rows_per_chunk: int = 1024
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(tokens, n_tokens) of up to about `rows_per_chunk` rows: every document followed by `eos`, cut into rows
    of at most `seq_length` tokens; `tokens` is the rows back to back."""
    eos_arr = np.array([eos], dtype=np.int32)
    pending: list[np.ndarray] = []
    lengths: list[int] = []
    for ids in docs:
        pending += (np.asarray(ids, dtype=np.int32), eos_arr)
        full, rest = divmod(len(ids) + 1, seq_length)
        lengths += [seq_length] * full + ([rest] if rest else [])
        if len(lengths) >= rows_per_chunk:
            yield np.concatenate(pending), np.array(lengths, dtype=np.int32)
            pending, lengths = [], []
    if lengths:
        yield np.concatenate(pending), np.array(lengths, dtype=np.int32)


def pack(token_streams: Iterator[list[int]], seq_length: int, eos: int, pad: int) -> Iterator[dict[str, Any]]:
    """Rows of `seq_length` tokens from documents joined by `eos`; the final row padded with `pad`."""
    for rows, n_tokens in pack_chunks(token_streams, seq_length, eos, pad):
        for row, n in zip(rows.tolist(), n_tokens.tolist(), strict=True):
            yield {"input_ids": row, "n_tokens": n}


def write_split(
    docs: Iterable[np.ndarray],
    dest: Path,
    scratch: Path,
    seq_length: int,
    eos: int,
    pad: int,
    shard_mb: float,
    packing: str = "concat",
) -> int:
    """Pack the token ids `docs` (in packing order) into `dest` (HF save_to_disk, sharded); returns the number of rows.
    packing "concat": fixed rows of `seq_length`; "none": a row per document (piece), of variable length."""
    import datasets
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter
    from datasets.table import MemoryMappedTable

    packed = packing == "concat"
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32"), length=seq_length if packed else -1),
            "n_tokens": datasets.Value("int32"),
        }
    )
    writer = ArrowWriter(features=features, path=str(scratch))
    content = hashlib.blake2b(digest_size=8)  # the fingerprint in state.json: from the rows, not the path
    chunks = pack_chunks(docs, seq_length, eos, pad) if packed else piece_chunks(docs, seq_length, eos)
    for rows, n_tokens in chunks:
        content.update(rows.tobytes())
        content.update(n_tokens.tobytes())
        values = pa.array(rows.ravel(), type=pa.int32())
        if packed:
            ids = pa.FixedSizeListArray.from_arrays(values, seq_length)
        else:
            offsets = np.concatenate([[0], np.cumsum(n_tokens, dtype=np.int64)]).astype(np.int32)
            ids = pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), values)
        writer.write_table(pa.table({"input_ids": ids, "n_tokens": pa.array(n_tokens, type=pa.int32())}))
    writer.finalize()
    writer.close()
    ds = datasets.Dataset(MemoryMappedTable.from_file(str(scratch)), fingerprint=content.hexdigest())
    shutil.rmtree(dest, ignore_errors=True)
    ds.save_to_disk(str(dest), max_shard_size=max(1, int(shard_mb * 10**6)))
    return ds.num_rows
