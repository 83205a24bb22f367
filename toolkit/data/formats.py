"""The input formats people have, read as records: JSONL (plain, .gz, .zst), plain text (a document per line,
compressed or not), Parquet, and the Arrow files of HF `datasets` folders (`save_to_disk`).

Every file is read in *pieces* (`Piece`): a byte range of an uncompressed JSONL or text file, a range of
row groups of a Parquet file, a range of rows of an Arrow file, or the whole of a compressed file (a gzip or
zstd stream cannot be entered in the middle). A piece of a byte range holds the lines that *start* inside it,
so cutting a file anywhere gives every line to exactly one piece, and the pieces of a file in order give its
records in file order.

Text lines are read as bytes and decoded one at a time: a line that is not UTF-8 is counted and skipped, and
the rest of the file is read (datatrove's JsonlReader drops the rest of a file at its first bad byte). What
cannot be used is counted per piece (`PieceReport`: kind → [count, first line within the piece]); a file that
breaks off (a truncated or corrupt gzip/zstd stream, a file that is not Parquet) is `unreadable_files`, with
the line where it broke and the reason, and the records before that line are kept.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSON_SUFFIXES = (".jsonl",)
"""Lines of these files are JSON objects; lines of any other text file are documents as they are."""
LANG_FIELDS = ("lang", "language")
STATE = "state.json"
"""What `datasets.Dataset.save_to_disk` writes beside its Arrow files (with dataset_info.json)."""

Kind = Literal["lines", "stream", "parquet", "arrow"]


@dataclass(frozen=True, slots=True)
class Record:
    text: str
    domain: str
    lang: str | None
    """The record's `lang` (or `language`) field, lower-cased; None when it has none."""


@dataclass(frozen=True)
class Source:
    """One input file and how to read it."""

    path: str
    kind: Kind
    json: bool
    """lines/stream: each line is a JSON object (else the line is the text)."""
    domain: str
    """The domain of records that do not name one: the file's stem, or the HF dataset folder's name."""


@dataclass(frozen=True)
class Piece:
    """Part of a source: bytes [start, end) (lines), row groups or rows [start, end); stream: all of it."""

    source: Source
    start: int
    end: int
    weight: float
    """The bytes on disk this piece stands for (progress and balancing); a file's pieces sum to its size."""


@dataclass
class PieceReport:
    """What reading a piece met; line numbers are counted from the piece's first line (1-based)."""

    lines: int = 0
    bytes: float = 0
    records: int = 0
    bad: dict[str, list[int]] = field(default_factory=dict)
    reason: str = ""
    """Why the file broke off, for unreadable_files."""

    def add(self, kind: str, line: int) -> None:
        self.bad.setdefault(kind, [0, line])[0] += 1


def is_hf_dataset(path: Path) -> bool:
    """A folder `datasets.Dataset.save_to_disk` wrote (its Arrow files are listed in state.json)."""
    return (path / STATE).is_file() and (path / "dataset_info.json").is_file()


def hf_data_files(folder: Path) -> list[Path]:
    """The Arrow files of an HF dataset folder, in row order; none when state.json does not list them."""
    try:
        state = json.loads((folder / STATE).read_text())
        return [folder / entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def source_of(path: Path) -> Source:
    suffixes = [s.lower() for s in path.suffixes]
    if path.suffix == ".arrow" and is_hf_dataset(path.parent):
        return Source(str(path), "arrow", False, path.parent.name)
    if suffixes[-1:] == [".parquet"]:
        return Source(str(path), "parquet", False, path.name[: -len(".parquet")])
    compressed = COMPRESSION.get(suffixes[-1]) if suffixes else None
    name = path.name[: -len(path.suffix)] if compressed else path.name
    inner = Path(name)
    kind: Kind = "stream" if compressed else "lines"
    return Source(str(path), kind, inner.suffix.lower() in JSON_SUFFIXES, inner.stem)


def units(source: Source) -> tuple[int, list[float]]:
    """(positions, weights) of the ways a source can be cut: lines and arrow files are cut at any byte or row
    (one weight per position: bytes per unit); parquet at row groups; streams not at all."""
    path = Path(source.path)
    size = path.stat().st_size
    if source.kind == "lines":
        return size, [1.0]
    if source.kind == "stream":
        return 1, [float(size)]
    try:
        if source.kind == "parquet":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(source.path).metadata
            sizes = [max(1, meta.row_group(i).total_byte_size) for i in range(meta.num_row_groups)]
            total = sum(sizes) or 1
            return len(sizes), [size * s / total for s in sizes] or [float(size)]
        rows = sum(b.num_rows for b in _arrow_batches(source.path))
        return rows, [size / max(rows, 1)]
    except Exception:  # not what its name says: read as one piece, which reports it unreadable
        return 1, [float(size)]


def _arrow_batches(path: str) -> Iterator[Any]:
    import pyarrow as pa

    with pa.memory_map(path) as mm:
        try:
            reader = pa.ipc.open_stream(mm)
        except pa.ArrowInvalid:  # the file format (datasets writes the stream format)
            reader = pa.ipc.open_file(mm)
            yield from (reader.get_batch(i) for i in range(reader.num_record_batches))
            return
        yield from reader


def read_piece(piece: Piece, fields: tuple[str, str], report: PieceReport) -> Iterator[Record]:
    """The records of `piece`; `fields` = (text field, domain field)."""
    source = piece.source
    try:
        if source.kind in ("lines", "stream"):
            yield from _lines(piece, fields, report)
        else:
            yield from _table(piece, fields, report)
    except _errors(source) as exc:
        report.add("unreadable_files", report.lines)
        report.reason = f"{type(exc).__name__}: {str(exc).strip() or 'truncated'}"[:200]
    if source.kind != "lines":
        report.bytes = piece.weight


def _errors(source: Source) -> tuple[type[BaseException], ...]:
    """What a broken file of this kind raises (pyarrow's ArrowInvalid is a ValueError)."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError, zlib.error)
    if source.kind == "stream" and Path(source.path).suffix.lower() != ".gz":
        import zstandard

        errors += (zstandard.ZstdError,)
    return errors


def _open_lines(piece: Piece) -> tuple[BinaryIO, BinaryIO]:
    """(line reader, raw file): the raw file's position is the compressed bytes consumed."""
    raw = open(piece.source.path, "rb")  # noqa: SIM115 - closed by the caller
    if piece.source.kind == "lines":
        return raw, raw
    if Path(piece.source.path).suffix.lower() == ".gz":
        return gzip.GzipFile(fileobj=raw), raw
    import zstandard

    stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return io.BufferedReader(stream), raw


def _lines(piece: Piece, fields: tuple[str, str], report: PieceReport) -> Iterator[Record]:
    source = piece.source
    reader, raw = _open_lines(piece)
    with raw, reader:
        if source.kind == "lines" and piece.start > 0:
            raw.seek(piece.start - 1)
            if raw.read(1) != b"\n":  # inside a line: it belongs to the piece where it starts
                raw.readline()
        position = raw.tell()
        for raw_line in reader:
            if source.kind == "lines":
                if position >= piece.end:
                    break
                position += len(raw_line)
                report.bytes += len(raw_line)
            elif report.lines % 256 == 0:
                report.bytes = raw.tell()
            report.lines += 1
            record = _record(raw_line, source, fields, report)
            if record is not None:
                report.records += 1
                yield record


def _record(raw: bytes, source: Source, fields: tuple[str, str], report: PieceReport) -> Record | None:
    try:
        line = raw.decode("utf-8-sig")  # a byte-order mark (editors on Windows) would cost the first record
    except UnicodeDecodeError:
        report.add("non_utf8_lines", report.lines)
        return None
    if not line.strip():
        return None
    if not source.json:
        return Record(line, source.domain, None)
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        report.add("malformed_json_lines", report.lines)
        return None
    return _from_fields(obj.get(fields[0]), obj.get(fields[1]), _lang(obj), source, report)


def _lang(obj: dict[str, Any]) -> Any:
    return obj.get(LANG_FIELDS[0], obj.get(LANG_FIELDS[1]))


def _from_fields(text: Any, domain: Any, lang: Any, source: Source, report: PieceReport) -> Record | None:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            report.add("non_utf8_lines", report.lines)
            return None
    if not isinstance(text, str):
        report.add("missing_text_field", report.lines)
        return None
    if not text.strip():
        return None
    tag = lang.strip().lower() if isinstance(lang, str) and lang.strip() else None
    return Record(text, domain if isinstance(domain, str) and domain else source.domain, tag)


def _table(piece: Piece, fields: tuple[str, str], report: PieceReport) -> Iterator[Record]:
    """Rows of a Parquet piece (row groups) or an Arrow piece (rows), the wanted columns only."""
    step = piece.weight / max(1, piece.end - piece.start)  # bytes per row group (parquet) or per row (arrow)
    for batch in _batches(piece, fields):
        names = batch.schema.names
        columns = [
            batch.column(names.index(f)).to_pylist() if f in names else None for f in (*fields, *LANG_FIELDS)
        ]
        n = batch.num_rows
        text, domain, lang, language = (c if c is not None else [None] * n for c in columns)
        for i in range(n):
            report.lines += 1
            record = _from_fields(
                text[i], domain[i], lang[i] if lang[i] is not None else language[i], piece.source, report
            )
            if record is not None:
                report.records += 1
                yield record
        report.bytes += step * (n if piece.source.kind == "arrow" else 1)


def _batches(piece: Piece, fields: tuple[str, str]) -> Iterator[Any]:
    if piece.source.kind == "parquet":
        import pyarrow.parquet as pq

        handle = pq.ParquetFile(piece.source.path)
        wanted = [f for f in (*fields, *LANG_FIELDS) if f in handle.schema_arrow.names]
        for group in range(piece.start, piece.end):
            yield handle.read_row_group(group, columns=wanted)
        return
    row = 0
    for batch in _arrow_batches(piece.source.path):
        lo, hi = max(piece.start - row, 0), min(piece.end - row, batch.num_rows)
        row += batch.num_rows
        if lo < hi:
            yield batch.slice(lo, hi - lo)
        if row >= piece.end:
            return
