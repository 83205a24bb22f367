"""Raw corpora in: files, folders and globs of JSONL, text, Parquet or HF `datasets` folders, as records
tagged with a domain (toolkit.data.formats reads each format).

A JSONL line is one document (`{"text": ..., "domain": ..., "lang": ...}`, only the text field required; the
field names are --text-field and --domain-field); a line of any other text file is one document. The domain is
the record's domain field when it has one, else the file's stem (`web.jsonl.gz` → `web`). Bad input is counted
per kind (`BAD_INPUT`) and per file, with the first bad line, never fatal: a real crawl always has a few broken
lines, and one of them should not cost a day's run; but when they are many, the user must be told which file
and where to look.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.data.formats import PieceReport, Record, hf_data_files, is_hf_dataset, read_piece, source_of
from toolkit.data.paths import is_dataset
from toolkit.errors import UserError

__all__ = ["BAD_INPUT", "FileReport", "InputReport", "Record", "expand_inputs", "iter_records"]
BAD_INPUT = (
    "empty_files",
    "malformed_json_lines",
    "missing_text_field",
    "non_utf8_lines",
    "unreadable_files",
)
"""Counters of input that could not be used: files of zero bytes, lines that are not a JSON object, records
without a string text field, lines that are not valid UTF-8, files that break off (a corrupt or truncated
gzip/zstd stream, a file that is not the Parquet or Arrow its name says)."""
BAD_WORDS = {
    "empty_files": "empty file",
    "malformed_json_lines": "malformed JSON",
    "missing_text_field": 'without a string "{field}"',
    "non_utf8_lines": "not UTF-8",
    "unreadable_files": "unreadable from there on",
}
GLOB = set("*?[")


@dataclass
class FileReport:
    lines: int = 0
    """Lines read (blank ones included)."""
    bad: dict[str, list[int]] = field(default_factory=dict)
    """Bad-input kind → [count, first line number (1-based; 0 for an empty file)]."""
    reason: str = ""
    """Why the file could not be read to its end (unreadable_files)."""

    def describe(self, text_field: str = "text") -> str:
        """`3 of 4 lines unusable: 1 malformed JSON (line 2), 2 not UTF-8 (first at line 3)`; a file that broke
        off: `unreadable after line 7 (BadGzipFile: ...)`, then its unusable lines if any."""
        if "empty_files" in self.bad:
            return "empty file"
        # in the order they first occur
        lines = {
            k: v for k, v in sorted(self.bad.items(), key=lambda kv: kv[1][1]) if k != "unreadable_files"
        }
        parts = [
            f"{n} {BAD_WORDS[kind].format(field=text_field)} ({'line' if n == 1 else 'first at line'} {first})"
            for kind, (n, first) in lines.items()
        ]
        unusable = f"{sum(n for n, _ in lines.values())} of {self.lines} lines unusable: {', '.join(parts)}"
        if "unreadable_files" not in self.bad:
            return unusable
        broke = f"unreadable after line {self.bad['unreadable_files'][1]} ({self.reason})"
        return f"{broke}; {unusable}" if lines else broke


@dataclass
class InputReport:
    """What reading the inputs met: totals per bad-input kind, and per file."""

    bad: dict[str, int] = field(default_factory=dict)
    """Bad-input kind → count, over all files (only kinds that occurred)."""
    files: dict[str, FileReport] = field(default_factory=dict)
    bytes_read: int = 0
    records: int = 0
    """Documents yielded (non-blank lines that were usable)."""
    text_field: str = "text"
    """The field a record's text was read from (named in the descriptions)."""

    def add(self, path: Path | str, kind: str, line: int, count: int = 1) -> None:
        self.bad[kind] = self.bad.get(kind, 0) + count
        entry = self.files.setdefault(str(path), FileReport()).bad.setdefault(kind, [0, line])
        entry[0] += count

    def add_piece(self, path: str, piece: PieceReport, first_line: int = 0) -> None:
        """A piece's report, its lines numbered after the `first_line` lines of the file read before it."""
        entry = self.files.setdefault(path, FileReport())
        entry.lines += piece.lines
        for kind, (n, line) in piece.bad.items():
            self.add(path, kind, first_line + line, n)
        entry.reason = entry.reason or piece.reason
        self.bytes_read += int(piece.bytes)
        self.records += piece.records

    def to_json(self) -> dict[str, Any]:
        files = {name: {"lines": f.lines, "bad": f.bad, "reason": f.reason} for name, f in self.files.items()}
        return {"bad": self.bad, "files": files, "bytes_read": self.bytes_read, "records": self.records,
                "text_field": self.text_field}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputReport:
        files = {name: FileReport(f["lines"], f["bad"], f["reason"]) for name, f in data["files"].items()}
        return cls(data["bad"], files, data["bytes_read"], data["records"], data["text_field"])

    @property
    def bad_lines(self) -> int:
        return sum(n for kind, n in self.bad.items() if kind not in ("empty_files", "unreadable_files"))

    def bad_files(self) -> dict[str, FileReport]:
        return {name: f for name, f in self.files.items() if f.bad}

    def manifest(self) -> dict[str, dict[str, dict[str, int | str]]]:
        """Per file with bad input: kind → {count, first_line} (and the reason an unreadable file broke off)."""
        out: dict[str, dict[str, dict[str, int | str]]] = {}
        for name, f in self.bad_files().items():
            out[name] = {kind: {"count": n, "first_line": first} for kind, (n, first) in f.bad.items()}
            if "unreadable_files" in f.bad:
                out[name]["unreadable_files"]["reason"] = f.reason
        return out

    def summary(self, limit: int = 3) -> str:
        """One clause naming the files with bad input (the first `limit` of them)."""
        files = self.bad_files()
        shown = [f"{name}: {f.describe(self.text_field)}" for name, f in list(files.items())[:limit]]
        more = (
            f"; and {len(files) - limit} more files (manifest.json bad_input_files)"
            if len(files) > limit
            else ""
        )
        return "; ".join(shown) + more


def expand_inputs(paths: list[Path], notes: list[str] | None = None) -> list[Path]:
    """The files to read, each once: each file given, and the files under each directory given (sorted; hidden
    files and prepared datasets skipped). What was skipped or repeated is said in `notes`."""
    files: dict[Path, Path] = {}  # resolved → as the user named it
    notes = [] if notes is None else notes
    for path in _globbed(paths):
        if path.is_dir():
            if is_dataset(path):
                raise UserError(
                    f"--input: {path} is a prepared dataset (dstk data prepare output), not raw text; give the "
                    "files it was prepared from"
                )
            found, skipped = _walk(path)
            notes.extend(f"--input: skipped {d} (a prepared dataset, not raw text)" for d in skipped)
            if not found:
                also = f" besides the prepared dataset {skipped[0]}" if skipped else ""
                raise UserError(f"--input: directory {path} has no files{also}")
        elif path.is_file():
            found = [path]
        elif not path.exists():
            raise UserError(f"--input: {path} not found")
        else:
            raise UserError(f"--input: {path} is neither a regular file nor a directory")
        for f in found:
            _not_utf16(f)
            key = f.resolve()
            if key in files:
                also = "" if str(files[key]) == str(f) else f" (also as {files[key]})"
                notes.append(f"--input: {f} was given more than once{also}; read once")
            else:
                files[key] = f
    return list(files.values())


def _not_utf16(path: Path) -> None:
    """A UTF-16 text file is named as such before any work (line by line it would be all "not UTF-8")."""
    from toolkit.paths import utf16_refusal

    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError:
        return  # unreadable files are reported by the reader, with the others
    problem = utf16_refusal(path, head, "--input")
    if problem is not None:
        raise problem


def _globbed(paths: list[Path]) -> Iterator[Path]:
    """Each path, a pattern that names no existing path replaced by what it matches (sorted)."""
    for path in paths:
        if path.exists() or not GLOB & set(str(path)):
            yield path
            continue
        matches = sorted(glob.glob(str(path), recursive=True))
        if not matches:
            raise UserError(f"--input: {path} matches no file")
        yield from map(Path, matches)


def _walk(root: Path) -> tuple[list[Path], list[Path]]:
    """(files under `root`, prepared datasets skipped), without descending into hidden folders or datasets; an
    HF dataset folder gives its Arrow files."""
    found, skipped = [], []
    for top, dirs, names in os.walk(root):
        folder = Path(top)
        if is_hf_dataset(folder):
            found.extend(hf_data_files(folder))
            dirs[:] = []
            continue
        names = [n for n in names if n != "dataset_dict.json"]  # a DatasetDict's index of its split folders
        keep = []
        for d in sorted(dirs):
            if d.startswith("."):
                continue
            if is_dataset(folder / d):
                skipped.append(folder / d)
            else:
                keep.append(d)
        dirs[:] = keep
        found.extend(folder / n for n in names if not n.startswith(".") and (folder / n).is_file())
    return sorted(found), skipped


def iter_records(
    paths: list[Path], stats: dict[str, int] | InputReport, fields: tuple[str, str] = ("text", "domain")
) -> Iterator[Record]:
    """Every non-blank document of `paths`, in file order, in this process; what cannot be used is counted in
    `stats` (a dict of totals per kind, or an InputReport, which also keeps them per file)."""
    from toolkit.data.shards import whole_file

    report = stats if isinstance(stats, InputReport) else InputReport(bad=stats)
    for path in expand_inputs(paths):
        if path.stat().st_size == 0:
            report.add(path, "empty_files", 0)
            continue
        piece, piece_report = whole_file(source_of(path)), PieceReport()
        yield from read_piece(piece, fields, piece_report)
        report.add_piece(str(path), piece_report)
