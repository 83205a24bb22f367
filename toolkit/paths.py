"""Paths the user gave, checked before any work: one line naming the flag and what is wrong, nothing written.

A command that finds out at its end that it cannot write its output has wasted the user's time (an export
after minutes of loading, a checkpoint after a whole run) and often left something half-written; one that
reports a temporary file's name (`.x.tmp: Is a directory`) has named a path the user never gave. So every
verb checks its inputs and outputs here first. Writability is probed, not inferred from permission bits (root
passes every `access()` test, yet cannot create a file in /proc): a probe file is created in the folder that
will hold the output, or in its nearest existing ancestor, and removed at once.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from toolkit.errors import UserError


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _probe(folder: Path, flag: str, target: Path) -> None:
    """A file can be created in `folder` (an existing directory), else a UserError about `target`."""
    verb = "write" if target.exists() else "create"
    if not folder.is_dir():
        raise UserError(f"{flag}: cannot {verb} {target}: {folder} is a file, not a folder")
    try:
        fd, name = tempfile.mkstemp(prefix=".dstk-probe-", dir=folder)
    except OSError as exc:
        raise UserError(f"{flag}: cannot {verb} {target}: {exc.strerror or exc} ({folder})") from None
    os.close(fd)
    os.unlink(name)


def output_file(path: Path, flag: str) -> Path:
    """A file this command will write (or replace): not a folder, and its folder can be written."""
    if path.is_dir():
        raise UserError(f"{flag}: {path} is a folder; give a file name (e.g. {path / 'out.json'})")
    _probe(_nearest_existing(path.parent), flag, path)
    return path


def output_dir(path: Path, flag: str) -> Path:
    """A folder this command will create or write into: not a file, and writable (or creatable)."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag}: {path} is a file; give a folder")
    _probe(path if path.is_dir() else _nearest_existing(path), flag, path)
    return path


def new_output_dir(path: Path, flag: str, overwrite: bool, what: str = "output") -> Path:
    """A folder this command fills from scratch: an existing non-empty one is refused unless `overwrite`,
    so nothing the user has is replaced silently."""
    output_dir(path, flag)
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise UserError(
            f"{flag}: {path} already holds {what}; give another folder, or --overwrite to replace it"
        )
    return path


def input_dir(path: Path, flag: str, what: str = "a folder") -> Path:
    """A folder this command reads: it exists and is a folder."""
    if not path.exists():
        raise UserError(f"{flag}: {path} not found")
    if not path.is_dir():
        raise UserError(f"{flag}: {path} is a file; expected {what}")
    return path


def input_file(path: Path, flag: str, what: str = "a file") -> Path:
    """A file this command reads: it exists and is a file."""
    if not path.exists():
        raise UserError(f"{flag}: {path} not found")
    if path.is_dir():
        raise UserError(f"{flag}: {path} is a folder; expected {what}")
    return path


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def utf16_refusal(path: Path, head: bytes, flag: str) -> UserError | None:
    """A one-line UserError for a file that starts with a UTF-16 (or UTF-32) byte-order mark, where dstk reads
    lines of UTF-8 (a UTF-16 text's newlines are two bytes, and every line would be "not UTF-8")."""
    if not head.startswith(UTF16_BOMS):
        return None
    return UserError(
        f"{flag}: {path} is UTF-16 text (it starts with the byte-order mark {head[:2].hex(' ').upper()}); "
        f"convert it to UTF-8 first, e.g. iconv -f UTF-16 -t UTF-8 {path} > {path.stem}.utf8{path.suffix}"
    )


def read_user_text(path: Path) -> str:
    """A text file the user wrote, as text: UTF-8, with or without the byte-order mark Windows editors write,
    or UTF-16 with its byte-order mark (Notepad's "Unicode"). Raises UnicodeDecodeError for anything else."""
    import codecs

    raw = path.read_bytes()
    if raw.startswith(UTF16_BOMS):
        return raw.decode("utf-16")
    return raw[len(codecs.BOM_UTF8) :].decode() if raw.startswith(codecs.BOM_UTF8) else raw.decode()
