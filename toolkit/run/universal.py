"""Universal checkpoints: DeepSpeed's topology-independent format, for resuming on another world size.

`convert` runs DeepSpeed's own converter (`deepspeed.checkpoint.ds_to_universal`) on one complete dstk
checkpoint of ZeRO-1, 2 or 3, carries dstk's per-rank files over, and writes a dstk manifest marked
`"universal": true` last, so the converted checkpoint is as crash-safe as the original. The converter wants a
`universal_checkpoint_info` record, which only Megatron-DeepSpeed's models write ("Required
universal_checkpoint_info state is missing" at ZeRO-1/2); for HF models, with no tensor-parallel merge
patterns to record, its `--inject_missing_state` writes the empty record it would have held. A ZeRO-0
checkpoint has nothing partitioned (DeepSpeed keeps the whole module and optimizer in
`mp_rank_00_model_states.pt`, which every rank loads), so it already resumes on any world size: it is copied
and marked `"portable": true`. Tested: 2-rank checkpoints of every stage resume on 1 rank. A ZeRO-3 universal
checkpoint does not load into ZeRO-2 (DeepSpeed asserts), so keep the stage.
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
    info = json.loads((ckpt_dir / tag / MANIFEST).read_text())
    info = {k: v for k, v in info.items() if k not in ("files", "written_at")}
    out.mkdir(parents=True, exist_ok=True)
    work = out / f".{tag}.converting"  # a failed conversion leaves nothing under its name
    shutil.rmtree(work, ignore_errors=True)
    try:
        if not any((ckpt_dir / tag).glob("*optim_states.pt")):  # ZeRO-0: nothing partitioned
            shutil.copytree(ckpt_dir / tag, work, ignore=shutil.ignore_patterns(MANIFEST))
            marks = {"portable": True}
        else:
            _ds_to_universal(ckpt_dir / tag, work)
            for f in (ckpt_dir / tag).glob("dstk_rank*.pt"):
                shutil.copy(f, work / f.name)
            marks = {"universal": True}
        write_manifest(work, {**info, **marks, "converted_from": str(ckpt_dir / tag)})
        work.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


UNIVERSAL_SUFFIX = "-universal"


def convert_beside(ckpt_dir: Path, tag: str) -> str:
    """Convert checkpoint `tag` into the same folder as `TAG-universal`, and return that tag (or `tag` itself
    when it already loads at any world size: converted, or ZeRO-0). The new name sorts after the original and
    before the next step, so `--resume auto` takes it, and the original stays as it was (`dstk launch
    --elastic`, toolkit/run/elastic.py)."""
    manifest = json.loads((ckpt_dir / tag / MANIFEST).read_text())
    if (
        manifest.get("universal")
        or manifest.get("portable")
        or not any((ckpt_dir / tag).glob("*optim_states.pt"))
    ):
        return tag
    new = f"{tag}{UNIVERSAL_SUFFIX}"
    if (ckpt_dir / new).is_dir() and check(ckpt_dir / new, verify_hashes=False) is None:
        return new  # an earlier restart converted it
    scratch = ckpt_dir / f".{new}.out"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        convert(ckpt_dir, scratch, tag)
        shutil.rmtree(ckpt_dir / new, ignore_errors=True)
        (scratch / tag).rename(ckpt_dir / new)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return new


def _ds_to_universal(src: Path, dest: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(src),
            "--output_folder",
            str(dest),
            "--num_extract_workers",
            "1",
            "--num_merge_workers",
            "1",
            "--inject_missing_state",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"ds_to_universal failed on {src}: {last[0]}")
