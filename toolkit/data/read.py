"""Raw corpora in: JSONL or plain-text files (or directories of them) as records tagged with a domain.

A JSONL line is one document (`{"text": ..., "domain": ..., "lang": ...}`, only `text` required); a line of
any other file is one document. The domain is the line's `domain` field when it has one, else the file's stem
(`web.jsonl` → `web`). Bad input is counted per kind (`BAD_INPUT`) and per file, with the first bad line, never
fatal: a real crawl always has a few broken lines, and one of them should not cost a day's run; but when they
are many, the user must be told which file and where to look.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.data.paths import is_dataset
from toolkit.errors import UserError

BAD_INPUT = ("empty_files", "malformed_json_lines", "missing_text_field", "non_utf8_lines")
"""Counters of input that could not be used: files of zero bytes, lines that are not a JSON object, JSON
objects without a string `text`, lines that are not valid UTF-8."""
BAD_WORDS = {
    "empty_files": "empty file",
    "malformed_json_lines": "malformed JSON",
    "missing_text_field": 'without a string "text"',
    "non_utf8_lines": "not UTF-8",
}


@dataclass(frozen=True, slots=True)
class Record:
    text: str
    domain: str
    lang: str | None
    """The line's `lang` (or `language`) field, lower-cased; None when the line has none."""


@dataclass
class FileReport:
    lines: int = 0
    """Lines read (blank ones included)."""
    bad: dict[str, list[int]] = field(default_factory=dict)
    """Bad-input kind → [count, first line number (1-based; 0 for an empty file)]."""

    def describe(self) -> str:
        """`3 of 4 lines unusable: 1 malformed JSON (line 2), 2 not UTF-8 (first at line 3)`."""
        if "empty_files" in self.bad:
            return "empty file"
        parts = [
            f"{n} {BAD_WORDS[kind]} ({'line' if n == 1 else 'first at line'} {first})"
            for kind, (n, first) in self.bad.items()
        ]
        bad = sum(n for n, _ in self.bad.values())
        return f"{bad} of {self.lines} lines unusable: {', '.join(parts)}"


@dataclass
class InputReport:
    """What reading the inputs met: totals per bad-input kind, and per file."""

    bad: dict[str, int] = field(default_factory=dict)
    """Bad-input kind → count, over all files (only kinds that occurred)."""
    files: dict[str, FileReport] = field(default_factory=dict)
    bytes_read: int = 0
    records: int = 0
    """Documents yielded (non-blank lines that were usable)."""

    def add(self, path: Path, kind: str, line: int) -> None:
        self.bad[kind] = self.bad.get(kind, 0) + 1
        entry = self.files.setdefault(str(path), FileReport()).bad.setdefault(kind, [0, line])
        entry[0] += 1

    @property
    def bad_lines(self) -> int:
        return sum(n for kind, n in self.bad.items() if kind != "empty_files")

    def bad_files(self) -> dict[str, FileReport]:
        return {name: f for name, f in self.files.items() if f.bad}

    def manifest(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per file with bad input: kind → {count, first_line}."""
        return {
            name: {kind: {"count": n, "first_line": first} for kind, (n, first) in f.bad.items()}
            for name, f in self.bad_files().items()
        }

    def summary(self, limit: int = 3) -> str:
        """One clause naming the files with bad input (the first `limit` of them)."""
        files = self.bad_files()
        shown = [f"{name}: {f.describe()}" for name, f in list(files.items())[:limit]]
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
    for path in paths:
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
            key = f.resolve()
            if key in files:
                also = "" if str(files[key]) == str(f) else f" (also as {files[key]})"
                notes.append(f"--input: {f} was given more than once{also}; read once")
            else:
                files[key] = f
    return list(files.values())


def _walk(root: Path) -> tuple[list[Path], list[Path]]:
    """(files under `root`, prepared datasets skipped), without descending into hidden folders or datasets."""
    found, skipped = [], []
    for top, dirs, names in os.walk(root):
        folder = Path(top)
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


def _tag(value: object) -> str | None:
    return value.strip().lower() if isinstance(value, str) and value.strip() else None


def iter_records(paths: list[Path], stats: dict[str, int] | InputReport) -> Iterator[Record]:
    """Every non-blank document of `paths`, in file order; what cannot be used is counted in `stats` (a dict
    of totals per kind, or an InputReport, which also keeps them per file)."""
    report = stats if isinstance(stats, InputReport) else InputReport(bad=stats)
    for path in expand_inputs(paths):
        if path.stat().st_size == 0:
            report.add(path, "empty_files", 0)
            continue
        jsonl = path.suffix == ".jsonl"
        entry = report.files.setdefault(str(path), FileReport())
        with path.open("rb") as f:
            for number, raw in enumerate(f, 1):
                entry.lines = number
                report.bytes_read += len(raw)
                record = _record(raw, jsonl, path, number, report)
                if record is not None:
                    report.records += 1
                    yield record


def _record(raw: bytes, jsonl: bool, path: Path, number: int, report: InputReport) -> Record | None:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        report.add(path, "non_utf8_lines", number)
        return None
    if not line.strip():
        return None
    if not jsonl:
        return Record(line, path.stem, None)
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        report.add(path, "malformed_json_lines", number)
        return None
    text = obj.get("text")
    if not isinstance(text, str):
        report.add(path, "missing_text_field", number)
        return None
    if not text.strip():
        return None
    domain = obj.get("domain")
    return Record(
        text,
        domain if isinstance(domain, str) and domain else path.stem,
        _tag(obj.get("lang", obj.get("language"))),
    )
