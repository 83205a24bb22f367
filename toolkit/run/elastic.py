"""`dstk launch --elastic`: a job that lost nodes, re-planned for the nodes that remain (no torch: the launcher
runs it between attempts; DeepSpeed's converter runs as a subprocess).

What changes: the cluster (the lost hosts dropped), the world size, and the layout for it — the same global
batch, so every step still reads the same rows (toolkit/data/loader.py: a step's rows depend on the global
batch and the position, not on how many ranks share them), with the micro-batch and gradient accumulation
toolkit/plan/elastic.py picks for the new data-parallel degree, refused in one line when it cannot run there
(not divisible, does not fit in memory). The newest complete checkpoint is converted to DeepSpeed's universal
format beside the original (`TAG-universal`, toolkit/run/universal.py), which the restarted ranks load at
their world size with its data position. What it changed is one line, and it is recorded in
`launch_events.jsonl`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.errors import UserError


@dataclass(frozen=True)
class Shrunk:
    cluster: Any
    """The cluster of the nodes that remain."""
    config: Path
    """The DeepSpeed config written for its world size."""
    resume_tag: str | None
    """The checkpoint the restart loads (converted when it had to be), or None when there is none."""
    message: str
    record: dict[str, Any]


def shrink(
    cluster: Any, lost: list[str], config: Path, model: Any, checkpoint_dir: Path | None, out: Path
) -> Shrunk:
    """The job of `cluster` without the `lost` hosts (see the module docstring)."""
    from toolkit.integrations.ds_config import rebatch, write
    from toolkit.integrations.ds_input import read_ds_config
    from toolkit.integrations.ds_layout import layout_from_config
    from toolkit.integrations.validate import validate_config
    from toolkit.plan.elastic import elastic_sizes

    remaining = [h for h in cluster.hostnames or [] if h not in lost]
    if not remaining:
        raise UserError(f"--elastic: every node is lost ({', '.join(lost)}); nothing to continue on")
    master = cluster.master_addr if cluster.master_addr not in lost else None  # else the first that remains
    smaller = cluster.model_copy(
        update={"nodes": len(remaining), "hostnames": remaining, "master_addr": master}
    )
    world = smaller.world_size
    cfg = read_ds_config(config)
    before = layout_from_config(cfg, cluster.world_size)
    (size,) = elastic_sizes(model, smaller, before, world, world, ("layout", "deepspeed"))
    if size.layout is None or not size.fits:
        raise UserError(
            f"--elastic: the job cannot go on the {len(remaining)} node(s) that remain ({', '.join(remaining)}, "
            f"{world} ranks): {size.reason}"
        )
    after = size.layout
    new_cfg = rebatch(cfg, after)
    verdict = validate_config(new_cfg, world, smaller.accelerator)
    if verdict.problems:
        raise UserError(f"--elastic: the config for {world} ranks: {verdict.problems[0].text}")
    path = out / f"elastic-world{world}.json"
    write(new_cfg, path)
    tag, converted = _checkpoint(checkpoint_dir)
    changed = [
        f"{name} {a} → {b}"
        for name, a, b in (
            ("dp", before.dp, after.dp),
            ("micro-batch", before.micro_batch_size, after.micro_batch_size),
            ("gradient accumulation", before.gradient_accumulation_steps, after.gradient_accumulation_steps),
        )
        if a != b
    ]
    where = (
        "no checkpoint yet: it starts from step 0"
        if tag is None
        else _resume_words(checkpoint_dir, tag, converted)
    )
    message = (
        f"--elastic: {', '.join(lost)} lost; the job goes on {', '.join(remaining)} with {world} rank(s) instead "
        f"of {cluster.world_size}: {', '.join(changed) or 'the same layout'} (global batch "
        f"{after.global_batch_size} kept: each step reads the same rows); {where}"
    )
    record = {
        "elastic": {
            "lost": lost,
            "nodes": remaining,
            "world_size": [cluster.world_size, world],
            "micro_batch_size": [before.micro_batch_size, after.micro_batch_size],
            "gradient_accumulation_steps": [
                before.gradient_accumulation_steps,
                after.gradient_accumulation_steps,
            ],
            "global_batch_size": after.global_batch_size,
            "config": str(path),
            "resume_tag": tag,
        }
    }
    return Shrunk(smaller, path, tag, message, record)


def _checkpoint(checkpoint_dir: Path | None) -> tuple[str | None, bool]:
    """The newest complete disk checkpoint, converted beside itself when its world size is fixed."""
    from toolkit.run.checkpoint import complete_tags
    from toolkit.run.universal import convert_beside

    if checkpoint_dir is None:
        return None, False
    tags = complete_tags(checkpoint_dir)  # shared-memory snapshots are node-local: not for several nodes
    if not tags:
        return None, False
    tag = convert_beside(checkpoint_dir, tags[0])
    return tag, tag != tags[0]


def _resume_words(checkpoint_dir: Path | None, tag: str, converted: bool) -> str:
    from toolkit.run.checkpoint import MANIFEST

    assert checkpoint_dir is not None
    manifest = json.loads((checkpoint_dir / tag / MANIFEST).read_text())
    step, position = manifest.get("step"), manifest.get("position")
    how = (
        f"from {tag.removesuffix('-universal')}, converted to universal as {tag}"
        if converted
        else f"from {tag}"
    )
    return f"it resumes at step {step}, data position {position}, {how}"
