"""Universal checkpoints: DeepSpeed's topology-independent format, for resuming on another world size.

`convert` runs DeepSpeed's own converter (`deepspeed.checkpoint.ds_to_universal`) on one complete dstk
checkpoint, carries dstk's per-rank files over, and writes a dstk manifest marked `"universal": true` last,
so the converted checkpoint is as crash-safe as the original. Verified on this machine: ZeRO-3 (and ZeRO-1/2)
checkpoints of 2 ranks resume on 1 rank; a ZeRO-3 universal checkpoint does not load into ZeRO-2 (DeepSpeed
asserts), so keep the stage.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from toolkit.errors import UserError
from toolkit.run.checkpoint import MANIFEST, check, complete_tags, write_manifest


def is_universal(tag_dir: Path) -> bool:
    try:
        return bool(json.loads((tag_dir / MANIFEST).read_text()).get("universal"))
    except (OSError, ValueError):
        return False


def convert(ckpt_dir: Path, out: Path, tag: str | None = None) -> Path:
    if not ckpt_dir.is_dir():
        raise UserError(f"--checkpoint: {ckpt_dir} is not a directory")
    tag = tag or next(iter(complete_tags(ckpt_dir)), None)
    if tag is None:
        raise UserError(f"--checkpoint: {ckpt_dir} holds no complete checkpoint")
    problem = check(ckpt_dir / tag)
    if problem:
        raise UserError(f"--tag: {ckpt_dir / tag} is not a complete checkpoint: {problem}")
    if out.resolve() == ckpt_dir.resolve():
        raise UserError("--out: must differ from --checkpoint")
    dest = out / tag
    if dest.exists():
        shutil.rmtree(dest)
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(ckpt_dir / tag),
            "--output_folder",
            str(dest),
            "--num_extract_workers",
            "1",
            "--num_merge_workers",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"ds_to_universal failed on {ckpt_dir / tag}: {last[0]}")
    for f in (ckpt_dir / tag).glob("dstk_rank*.pt"):
        shutil.copy(f, dest / f.name)
    info = json.loads((ckpt_dir / tag / MANIFEST).read_text())
    info = {k: v for k, v in info.items() if k not in ("files", "written_at")}
    write_manifest(dest, {**info, "universal": True, "converted_from": str(ckpt_dir / tag)})
    return dest
