"""What a resume will meet, checked before any rank starts (no torch: manifests are JSON).

A checkpoint's `dstk_manifest.json` records the step, the world size, the layout and the model it was written
with. Resuming it under another ZeRO stage, world size or model fails deep inside `load_checkpoint` on every
rank (about 100 lines of tracebacks, after ~15 s of start-up); a resume past `--steps` does nothing at all.
`dstk launch` and `dstk train` call `check_resume` first, so each is one line and exit 2, with the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.run.checkpoint import MANIFEST, check, complete_tags, newest_complete

# layout fields whose change a plain (non-universal) DeepSpeed checkpoint cannot follow
_PARTITIONING = ("zero_stage", "tp", "pp", "ep", "sp")


def resume_manifest(checkpoint_dir: Path, resume: str) -> dict[str, Any] | None:
    """The manifest of the checkpoint `--resume` picks (auto: the newest complete one), or None when there is
    nothing to resume from; a UserError when a named tag is not a complete checkpoint."""
    if resume == "never":
        return None
    if resume == "auto":  # the newest of both tiers (toolkit.run.tiers): what the run will load
        found = newest_complete(checkpoint_dir, verify_hashes=False)
        if not found:
            return None
        where, tag = found[0]
        return {**json.loads((where / tag / MANIFEST).read_text()), "where": str(where / tag)}
    else:
        tag = resume
        problem = check(checkpoint_dir / tag, verify_hashes=False)
        if not (checkpoint_dir / tag).is_dir():
            problem = "no such checkpoint"
        if problem:
            found = complete_tags(checkpoint_dir, verify_hashes=False)
            hint = f"complete ones: {', '.join(found[:3])}" if found else "it holds no complete checkpoint"
            raise UserError(
                f"--resume: {checkpoint_dir / tag} is not a complete checkpoint ({problem}); {hint}"
            )
    return json.loads((checkpoint_dir / tag / MANIFEST).read_text())


def check_resume(
    checkpoint_dir: Path | None,
    resume: str,
    steps: int | None,
    world_size: int,
    layout: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
) -> None:
    """One-line UserError when resuming would fail or do nothing; silent when it will work. `steps` None: the
    run trains nothing (--eval-only), so any step is fine."""
    if checkpoint_dir is None:
        return
    manifest = resume_manifest(checkpoint_dir, resume)
    if manifest is None:
        return
    where, step = manifest.get("where", f"{checkpoint_dir / manifest['tag']}"), int(manifest["step"])
    if steps is not None and step >= steps:
        raise UserError(
            f"--steps: the checkpoint {where} is at step {step} already, so --steps {steps} leaves nothing to "
            f"train; give --steps > {step} to continue"
        )
    if manifest.get("universal"):  # converted by dstk checkpoint convert: loads at any world size
        return
    saved = manifest.get("layout") or {}
    # ZeRO-0 keeps the whole module and optimizer in one file every rank loads (run/universal.py)
    any_world = manifest.get("portable") or saved.get("zero_stage") == 0
    convert = f"convert it first: dstk checkpoint convert --checkpoint {checkpoint_dir} --out DIR"
    if not any_world and manifest.get("world_size") not in (None, world_size):
        raise UserError(
            f"--resume: {where} was written by {manifest['world_size']} ranks and this job has {world_size}; {convert}"
        )
    changed = [
        f"{k} {saved[k]} → {layout[k]}"
        for k in _PARTITIONING
        if layout and k in saved and saved[k] != layout[k]
    ]
    if changed:
        raise UserError(
            f"--resume: {where} was written with another partitioning ({', '.join(changed)}); {convert}"
        )
    old = manifest.get("model")
    if old and model:
        differs = [k for k in sorted(set(old) | set(model)) if k != "name" and old.get(k) != model.get(k)]
        if differs:
            raise UserError(
                f"--model: {where} holds {old.get('name')}, whose {', '.join(differs[:4])} differ from "
                f"{model.get('name')}; resume with that model, or grow it: dstk grow"
            )
