"""The work folder of `dstk data prepare` (`OUT/.dstk-work`): a folder per stage, named by a fingerprint of
everything that decides its output, so that a rerun of the same command finds the work already done.

Stages, in order (each a datatrove executor with its own `logs/`, whose `completions/` say which tasks are
done): `filter` (read, clean, filter, write the survivors and their dedup keys, one task per shard),
`buckets` (datatrove's MinHash bucket merge: the pairs of documents that share a key), `resolve` (which
documents the pairs remove, and the checks that need every shard's counts), `tokenizer` (trained on a sample,
or the one given), `tokenize` (one task per shard) and `assemble` (mix, split, shuffle, write Arrow and
Megatron files and the manifest).

A stage's fingerprint covers its own settings and the fingerprints of the stages it reads (`PARENTS`):
changing `--mix` redoes only `resolve` and `assemble`, changing a filter threshold redoes everything. Folders of other fingerprints are stale (a
different command wrote them) and are removed when a run starts. Every file a task writes appears whole, by
rename, and the task is marked done only after that, so a task killed half-way is simply run again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

WORK = ".dstk-work"
STAGES = ("filter", "buckets", "resolve", "tokenizer", "tokenize", "assemble")
PARENTS = {
    "filter": (),
    "buckets": ("filter",),
    "resolve": ("buckets",),
    "tokenizer": ("buckets",),
    "tokenize": ("tokenizer",),
    "assemble": ("tokenize", "resolve"),
}
"""The stages whose output each stage reads (the resolve stage's removals depend on the buckets alone, so the
tokenizer does not follow a change of what resolve checks, such as --mix)."""
VERSION = 1
"""Bumped when a stage's files change meaning, so work left by an older dstk is not reused."""
VERDICT = "verdict.json"
"""In the resolve and assemble folders: {"error": one line} when the data cannot give a dataset."""


def fingerprint(parent: str, settings: Any) -> str:
    blob = json.dumps([VERSION, parent, settings], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def stage_dirs(work: Path, settings: dict[str, Any]) -> dict[str, Path]:
    """The folder of each stage in `STAGES` order, each fingerprint chained on its parents'."""
    prints: dict[str, str] = {}
    for name in STAGES:
        prints[name] = fingerprint("+".join(prints[p] for p in PARENTS[name]), settings[name])
    return {name: work / f"{name}-{fp}" for name, fp in prints.items()}


def remove_stale(work: Path, keep: list[Path]) -> None:
    """Remove what an earlier run with other settings left in `work` (each stage folder not in `keep`)."""
    if not work.is_dir():
        return
    for entry in work.iterdir():
        if entry not in keep:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def rank_file(folder: Path | str, rank: int, suffix: str) -> Path:
    return Path(folder) / f"{rank:05d}{suffix}"


@contextmanager
def atomic(path: Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Write `path` whole or not at all: into a file of this process's own in the stage's `tmp/` (outside the
    folders datatrove lists), renamed over `path` at the end."""
    scratch = next(p for p in path.parents if p.name.partition("-")[0] in STAGES) / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch / f"{path.name}.{os.getpid()}"
    with open(tmp, mode) as f:
        yield f
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    with atomic(path, "w") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def verdict(folder: Path | str) -> str | None:
    """The error a stage found in the data (None: it found none, or has not run)."""
    path = Path(folder) / VERDICT
    return read_json(path).get("error") if path.is_file() else None
