"""A prepared dataset's files against its manifest: what `dstk data prepare` records (`record`) and what the
pre-flight checks before any rank starts (`check_files`). Standard library only: no torch, no pyarrow.

A shard cut short (a copy that stopped, a full disk during `data prepare`, a file system that lost its tail)
or replaced, or a tokenizer that is not the one the data was tokenized with, otherwise surfaces on every
rank after start-up — as a pyarrow traceback when the shard is memory-mapped, or never: a tokenizer swapped
after tokenizing trains without complaint and exports a model whose ids mean other words. Here each is one
line naming the file:

- every shard the split's `state.json` lists exists, starts as an Arrow IPC stream does (the continuation
  marker 0xFFFFFFFF) and ends with its end-of-stream marker (0xFFFFFFFF then a zero length: what
  `ArrowWriter.finalize` writes last, so any truncation removes it) — 16 bytes read per shard;
- with a manifest that records them (`files`, written since this check exists), each shard's size;
- each tokenizer file's SHA-256 (`tokenizer_files`), else the combined `tokenizer_hash` older manifests have.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from toolkit.data.paths import TOKENIZER
from toolkit.errors import UserError

CONTINUATION = b"\xff\xff\xff\xff"
END_OF_STREAM = CONTINUATION + b"\x00\x00\x00\x00"
SPLITS = ("train", "validation")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record(dataset: Path) -> dict[str, Any]:
    """The manifest fields `check_files` compares: each shard's bytes, each tokenizer file's SHA-256."""
    shards = {
        str(p.relative_to(dataset)): p.stat().st_size
        for split in SPLITS
        for p in sorted((dataset / split).glob("*.arrow"))
    }
    tokenizer = {p.name: _sha256(p) for p in sorted((dataset / TOKENIZER).glob("*.json"))}
    return {"files": shards, "tokenizer_files": tokenizer}


def shards(dataset: Path, split: str) -> list[Path]:
    """The Arrow files of a split, as its `state.json` lists them (what `datasets.load_from_disk` opens)."""
    state = dataset / split / "state.json"
    if not state.is_file():
        return sorted((dataset / split).glob("*.arrow"))
    try:
        names = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    except (ValueError, KeyError, TypeError):
        raise UserError(f"--data: {state} is not a datasets state file; prepare the data again") from None
    return [dataset / split / n for n in names]


def _check_shard(path: Path, size: int | None) -> None:
    redo = "prepare the data again (dstk data prepare --overwrite) or restore the file"
    if not path.is_file():
        raise UserError(f"--data: {path} is missing (its split's state.json lists it); {redo}")
    actual = path.stat().st_size
    if size is not None and actual != size:
        raise UserError(f"--data: {path} has {actual:,} bytes, the manifest says {size:,}: {redo}")
    with path.open("rb") as f:
        head = f.read(4)
        f.seek(max(actual - len(END_OF_STREAM), 0))
        tail = f.read(len(END_OF_STREAM))
    if head != CONTINUATION:
        raise UserError(f"--data: {path} is not an Arrow stream (it does not start as one); {redo}")
    if tail != END_OF_STREAM:
        raise UserError(
            f"--data: {path} is truncated ({actual:,} bytes, no Arrow end-of-stream marker at its end); {redo}"
        )


def check_files(dataset: Path, manifest: dict[str, Any]) -> None:
    """One line naming the first file of `dataset` that is not what `manifest` says (module docstring)."""
    sizes = manifest.get("files") or {}
    for split in SPLITS:
        if not (dataset / split).is_dir():
            if split == "train":
                raise UserError(f"--data: {dataset / split} is missing; prepare the data again")
            continue
        for path in shards(dataset, split):
            _check_shard(path, sizes.get(str(path.relative_to(dataset))))
    folder = dataset / TOKENIZER
    redo = (
        "the data was tokenized with another tokenizer: restore it, or prepare the data again with this one"
    )
    files = manifest.get("tokenizer_files")
    if files:
        for name, digest in files.items():
            path = folder / name
            if not path.is_file():
                raise UserError(f"--data: {path} is missing; {redo}")
            if _sha256(path) != digest:
                raise UserError(
                    f"--data: {path} does not match the manifest's SHA-256 ({digest[:16]}…); {redo}"
                )
        return
    from toolkit.data.tokenizer import tokenizer_hash

    if (
        manifest.get("tokenizer_hash")
        and folder.is_dir()
        and tokenizer_hash(folder) != manifest["tokenizer_hash"]
    ):
        names = ", ".join(p.name for p in sorted(folder.glob("*.json")))
        raise UserError(
            f"--data: {folder} ({names}) does not match the manifest's tokenizer_hash "
            f"{manifest['tokenizer_hash']}; {redo}"
        )
