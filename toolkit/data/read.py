"""Raw corpora in: JSONL or plain-text files (or directories of them) as records tagged with a domain.

A JSONL line is one document (`{"text": ..., "domain": ..., "lang": ...}`, only `text` required); a line of
any other file is one document. The domain is the line's `domain` field when it has one, else the file's stem
(`web.jsonl` → `web`). Bad input is counted in `stats` under the names of `BAD_INPUT`, never fatal: a real
crawl always has a few broken lines, and one of them should not cost a day's run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UserError

BAD_INPUT = ("empty_files", "malformed_json_lines", "missing_text_field", "non_utf8_lines")
"""Counters of input that could not be used: files of zero bytes, lines that are not a JSON object, JSON
objects without a string `text`, lines that are not valid UTF-8."""


@dataclass(frozen=True, slots=True)
class Record:
    text: str
    domain: str
    lang: str | None
    """The line's `lang` (or `language`) field, lower-cased; None when the line has none."""


def expand_inputs(paths: list[Path]) -> list[Path]:
    """The files to read: each file given, and the files under each directory given (sorted, hidden skipped)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(
                f
                for f in path.rglob("*")
                if f.is_file() and not any(p.startswith(".") for p in f.relative_to(path).parts)
            )
            if not found:
                raise UserError(f"--input: directory {path} has no files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise UserError(f"--input: {path} is neither a file nor a directory")
    return files


def _count(stats: dict[str, int], key: str) -> None:
    stats[key] = stats.get(key, 0) + 1


def _tag(value: object) -> str | None:
    return value.strip().lower() if isinstance(value, str) and value.strip() else None


def iter_records(paths: list[Path], stats: dict[str, int]) -> Iterator[Record]:
    """Every non-blank document of `paths`, in file order; what cannot be used is counted in `stats`."""
    for path in expand_inputs(paths):
        if path.stat().st_size == 0:
            _count(stats, "empty_files")
            continue
        jsonl = path.suffix == ".jsonl"
        with path.open("rb") as f:
            for raw in f:
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    _count(stats, "non_utf8_lines")
                    continue
                if not jsonl:
                    if line.strip():
                        yield Record(line, path.stem, None)
                    continue
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    _count(stats, "malformed_json_lines")
                    continue
                if not isinstance(obj, dict):
                    _count(stats, "malformed_json_lines")
                    continue
                text = obj.get("text")
                if not isinstance(text, str):
                    _count(stats, "missing_text_field")
                    continue
                if text.strip():
                    domain = obj.get("domain")
                    yield Record(
                        text,
                        domain if isinstance(domain, str) and domain else path.stem,
                        _tag(obj.get("lang", obj.get("language"))),
                    )
