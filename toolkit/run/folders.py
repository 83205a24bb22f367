"""The folders a training job writes, and what it finds in them (no torch): the locks that make a run or
checkpoint folder one job's (toolkit.launcher.lock), the checkpoints an earlier run left (resumed only when
asked, removed only when asked), and an earlier run's records in the run folder (set aside, never appended to).

A relaunch without `--resume` into a folder that holds checkpoints used to train from step 0 and replace them
without a word; two jobs in one folder interleaved their metrics and wrote the same tags over each other.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.launcher.lock import TOKEN_ENV, Lock, check_folder, lock_folder, stale_note

RECORDS = ("metrics.jsonl", "events.jsonl", "summary.json")
"""What a run writes into its run folder about itself; an earlier run's are set aside by a fresh one."""


def train_folders(run_dir: Path | None, checkpoint_dir: Path | None) -> list[tuple[Path, str]]:
    """(folder, flag) of a `dstk train` run, each folder once."""
    out: list[tuple[Path, str]] = []
    for folder, flag in ((run_dir, "--run-dir"), (checkpoint_dir, "--checkpoint-dir")):
        if folder is not None and all(folder.resolve() != f.resolve() for f, _ in out):
            out.append((folder, flag))
    return out


def hold(folders: list[tuple[Path, str]], token: str, dry_run: bool = False) -> tuple[list[Lock], list[str]]:
    """Lock every folder for this job (`dry_run`: only refuse one another job holds), or release what was
    taken and raise the refusal naming the holder. Returns the locks and a note per stale lock taken over."""
    locks: list[Lock] = []
    try:
        for folder, flag in folders:
            if dry_run:
                check_folder(folder, flag, token)
                continue
            locks.append(lock_folder(folder, flag, token))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    notes = [n for (_, flag), lock in zip(folders, locks, strict=False) if (n := stale_note(flag, lock))]
    return locks, notes


def claim_on_rank(args: Any) -> list[str]:
    """`dstk train`'s folders, taken by global rank 0 (the others trust it): held for this process's life
    unless the launcher that started the job holds them under its token. Notes to say once."""
    if os.environ.get("RANK", "0") != "0":
        return []
    _, notes = hold(train_folders(args.run_dir, args.checkpoint_dir), os.environ.get(TOKEN_ENV, ""))
    return notes


def step_dirs(checkpoint_dir: Path) -> list[str]:
    """The checkpoint tags (complete or not) a folder holds, newest first."""
    if not checkpoint_dir.is_dir():
        return []
    return sorted((p.name for p in checkpoint_dir.iterdir() if p.is_dir() and p.name.startswith("step")),
                  reverse=True)  # fmt: skip


def check_checkpoint_dir(checkpoint_dir: Path | None, resume: str, overwrite: bool) -> str | None:
    """A folder that holds checkpoints is resumed (`--resume`) or started over (`--overwrite-checkpoints`),
    never written over without a word; a UserError otherwise. Returns a note when they will be removed."""
    if overwrite and resume != "never":
        raise UserError(
            f"--overwrite-checkpoints: starts over from step 0, --resume {resume} continues; give one"
        )
    tags = step_dirs(checkpoint_dir) if checkpoint_dir is not None else []
    if not tags or resume != "never":
        return None
    shown = ", ".join(tags[:3]) + (f" and {len(tags) - 3} more" if len(tags) > 3 else "")
    if overwrite:
        return f"--overwrite-checkpoints: {shown} in {checkpoint_dir} will be removed before step 1"
    raise UserError(
        f"--checkpoint-dir: {checkpoint_dir} holds checkpoints ({shown}) and --resume is never: continue them "
        "with --resume auto, or start over in a new folder or with --overwrite-checkpoints (which removes them)"
    )


def remove_checkpoints(checkpoint_dir: Path) -> list[str]:
    """--overwrite-checkpoints on rank 0, before the first step: the folder's checkpoints and this node's
    shared-memory snapshots of it go, so `--resume auto` can never pick an earlier run's state."""
    from toolkit.run.checkpoint import POINTER, memory_tier

    tags = step_dirs(checkpoint_dir)
    for tag in tags:
        shutil.rmtree(checkpoint_dir / tag, ignore_errors=True)
    (checkpoint_dir / POINTER).unlink(missing_ok=True)
    shutil.rmtree(memory_tier(checkpoint_dir), ignore_errors=True)
    return tags


def set_aside_records(run_dir: Path) -> str | None:
    """A run that starts at step 0 in a run folder with an earlier run's records: they move to
    `RUN_DIR/earlier/<time>/` (a resumed run appends to them instead). A sentence when it happened."""
    found = [run_dir / name for name in RECORDS if (run_dir / name).exists()]
    if not found:
        return None
    target = run_dir / "earlier" / time.strftime("%Y%m%d-%H%M%S")
    while target.exists():
        target = target.with_name(target.name + "+")
    target.mkdir(parents=True)
    for path in found:
        path.replace(target / path.name)
    names = ", ".join(p.name for p in found)
    return f"--run-dir: an earlier run's {names} moved to {target} (this run starts at step 0)"
