"""Progressive training around `dstk grow`: the re-plan of a grown model, and a schedule that runs
train segment → grow → train segment through the ordinary commands.

Pure: standard library, pydantic and the planner only (no torch), so the re-plan prints in milliseconds and the
orchestrator's process stays small while its `dstk launch` children train.

A schedule (YAML or JSON) is a list of stages, each a model description trained for `steps` optimizer steps;
every stage after the first starts from `dstk grow` of the previous stage's final checkpoint. Per stage,
under `RUN_DIR/stageN/`:

1. `dstk config --plan --model M --cluster C --train-steps STEPS [config flags] -o ds_config.json` — the
   planner re-plans each stage, so a grown model gets the layout it needs;
2. (N > 0) `dstk grow --from RUN_DIR/stage{N-1}/checkpoints --from-model M_{N-1} --to M -o init [the config's
   layout flags, for the re-plan] [--data D] [grow flags]`;
3. `dstk launch --cluster C --config ds_config.json -- --model M --steps STEPS --checkpoint-dir checkpoints
   --save-every STEPS --seed SEED+N [--init-from init] [--data D] [train flags]`.

Each segment has its own LR schedule (warm-up and decay over its own steps, as `dstk config` writes it), and its
data order is seeded with SEED+N: `dstk train --init-from` starts at data position 0, and a new seed keeps the
grown model from replaying the first segment's batches in the same order. `RUN_DIR/progressive.json` records
every stage's losses, evaluations, tokens and training FLOPs (6·N·tokens, Kaplan et al. 2020).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolkit.errors import UserError
from toolkit.plan.params import count_params
from toolkit.plan.query import PlanQuery
from toolkit.plan.specs import ClusterSpec, ModelSpec

_STRICT = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


# ---- the re-plan --------------------------------------------------------------------------------------------


def replan(
    parent: ModelSpec,
    grown: ModelSpec,
    cluster: ClusterSpec,
    query: PlanQuery | None = None,
    grown_ref: str | None = None,
    cluster_ref: str | None = None,
) -> list[str]:
    """Lines saying which layout the planner picks for the parent and for the grown model, and what changes.

    The global batch stays the parent's plan's unless given: a progressive run keeps its batch, and the
    planner's default batch grows with the model, which would show as a change nobody asked for."""
    from toolkit.plan.planner import nothing_fits_message, plan

    query = query or PlanQuery()
    lines = [f"Re-plan on {cluster.name} ({cluster.nodes} × {cluster.gpus_per_node}):"]
    before = plan(parent, cluster, query)
    if query.global_batch_size is None and before is not None:
        query = query.model_copy(update={"global_batch_size": before.best.layout.global_batch_size})
    after = plan(grown, cluster, query)
    for label, spec, p in (("parent", parent, before), ("grown ", grown, after)):
        what = f"{spec.name} ({spec.n_layers} layers, h={spec.hidden_size}, {count_params(spec).total / 1e6:,.2f}M params)"
        if p is None:
            lines.append(f"  {label} {what}: {nothing_fits_message(spec, cluster, query)}")
        else:
            est = p.best.estimate
            lines.append(f"  {label} {what}: {est.layout.describe()}, {est.tokens_per_s:,.0f} tokens/s")
    if before is not None and after is not None:
        old, new = before.best.layout.model_dump(), after.best.layout.model_dump()
        changed = [f"{k} {old[k]} → {new[k]}" for k in old if old[k] != new[k]]
        lines.append(
            "  the layout changes: " + ", ".join(changed)
            if changed
            else "  the parent's layout still fits best"
        )
    if after is not None:
        from toolkit.plan.layout import LAYOUT_FLAGS

        wanted = {**query.pins(), "global_batch_size": after.best.layout.global_batch_size}
        flags = []
        for name, value in wanted.items():
            flag = LAYOUT_FLAGS.get(name, "--" + name.replace("_", "-"))
            flags.append(
                flag if value is True else f"--no-{flag[2:]}" if value is False else f"{flag} {value}"
            )
        lines.append(
            f"  its config (the same re-plan): dstk config --plan --model {grown_ref or grown.name} "
            f"--cluster {cluster_ref or cluster.name} {' '.join(flags)} -o ds.json"
        )
    return lines


# ---- the schedule -------------------------------------------------------------------------------------------


class Stage(BaseModel):
    """One training segment."""

    model_config = _STRICT

    model: str
    """Model description (preset, dstk YAML/JSON or HF config.json) of this segment."""
    steps: int = Field(gt=0)
    """Optimizer steps of this segment."""
    grow: list[str] = []
    """Extra `dstk grow` flags for reaching this stage from the previous one (e.g. [--depth-method, interleave])."""
    config: list[str] = []
    """Extra `dstk config` flags for this segment (after the schedule's)."""
    train: list[str] = []
    """Extra `dstk train` flags for this segment (after the schedule's)."""


class Schedule(BaseModel):
    """Train → grow → train, through dstk config, dstk grow and dstk launch."""

    model_config = _STRICT

    stages: list[Stage] = Field(min_length=1)
    """Segments in order; each after the first grows the previous one's final checkpoint."""
    cluster: str = "cpu"
    """Cluster preset or file for dstk config --plan, dstk grow's re-plan and dstk launch."""
    nodes: int | None = Field(default=None, gt=0)
    """Cluster override."""
    gpus_per_node: int | None = Field(default=None, gt=0)
    """Cluster override (ranks per node)."""
    data: str | None = None
    """dstk data prepare output (default: each segment's dstk train prepares the demo corpus)."""
    run_dir: str = "runs/progressive"
    """Stages go to RUN_DIR/stageN/."""
    seed: int = 0
    """Stage N trains with --seed SEED+N (data order and dropout)."""
    master_port: int | None = Field(default=None, gt=0, lt=65536)
    """dstk launch --master-port (default: a free port per stage, so concurrent jobs do not collide)."""
    config: list[str] = []
    """Extra `dstk config` flags for every stage (e.g. [--global-batch, 16, --lr, 1e-3])."""
    train: list[str] = []
    """Extra `dstk train` flags for every stage (e.g. [--eval-every, 20])."""


def load_schedule(path: Path) -> Schedule:
    from toolkit.plan.load import build, read_mapping

    return build(Schedule, read_mapping(path), str(path))


def _dstk(*args: str) -> list[str]:
    return [sys.executable, "-m", "toolkit.cli", *args]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _layout_flags(flags: list[str]) -> list[str]:
    """The layout constraints among `dstk config` flags, for dstk grow's re-plan (it takes no --lr etc.)."""
    from toolkit.plan.layout import LAYOUT_FLAGS, LayoutRequest

    names = set(LAYOUT_FLAGS.values())
    # on/off flags (argparse's BooleanOptionalAction: --x / --no-x) take no value
    switches = {
        flag
        for name, flag in LAYOUT_FLAGS.items()
        if LayoutRequest.model_fields[name].annotation in (bool, bool | None)
    }
    out, i = [], 0
    while i < len(flags):
        flag = flags[i].split("=", 1)[0]
        takes_value = "=" not in flags[i] and flag in names and flag not in switches
        if flag in names or flag.replace("--no-", "--") in switches:
            out += flags[i : i + 1 + takes_value]
        i += 1 + takes_value
    return out


def stage_commands(s: Schedule, i: int) -> dict[str, list[str]]:
    """The commands that run stage `i` (config, grow for i > 0, launch), as argument lists."""
    stage, run = s.stages[i], Path(s.run_dir)
    here = run / f"stage{i}"
    cluster = ["--cluster", s.cluster]
    cluster += ["--nodes", str(s.nodes)] if s.nodes else []
    cluster += ["--gpus-per-node", str(s.gpus_per_node)] if s.gpus_per_node else []
    data = ["--data", s.data] if s.data else []
    cmds = {
        "config": _dstk("config", "--plan", "--model", stage.model, *cluster, "--train-steps", str(stage.steps),
                        "--log-dir", str(here / "logs"), *s.config, *stage.config, "-o", str(here / "ds_config.json")),
    }  # fmt: skip
    init = []
    if i > 0:
        previous = run / f"stage{i - 1}" / "checkpoints"
        cmds["grow"] = _dstk("grow", "--from", str(previous), "--from-model", s.stages[i - 1].model, "--to",
                             stage.model, "-o", str(here / "init"),
                             *cluster, *_layout_flags([*s.config, *stage.config]), *data, *stage.grow)  # fmt: skip
        init = ["--init-from", str(here / "init")]
    port = str(s.master_port or _free_port())
    cmds["launch"] = _dstk("launch", *cluster, "--master-port", port, "--config", str(here / "ds_config.json"), "--run-dir",
                           str(here / "launch"), "--", "--model", stage.model, "--steps", str(stage.steps),
                           "--run-dir", str(here), "--checkpoint-dir", str(here / "checkpoints"), "--save-every",
                           str(stage.steps), "--seed", str(s.seed + i), "--no-progress", *init, *data, *s.train,
                           *stage.train)  # fmt: skip
    return cmds


def _stage_record(s: Schedule, i: int, spec: ModelSpec) -> dict[str, Any]:
    here = Path(s.run_dir) / f"stage{i}"
    summary = json.loads((here / "summary.json").read_text())
    seq = spec.seq_length
    if s.data and (Path(s.data) / "manifest.json").is_file():
        seq = json.loads((Path(s.data) / "manifest.json").read_text())["seq_length"]
    tokens_per_step = summary["layout"]["global_batch_size"] * seq
    record = {
        "model": spec.name,
        "n_layers": spec.n_layers,
        "hidden_size": spec.hidden_size,
        "n_params": count_params(spec).total,
        "steps": len(summary["losses"]),
        "tokens_per_step": tokens_per_step,
        "losses": summary["losses"],
        "evals": summary["evals"],
        "step_time_s": summary.get("step_time_s"),
        "layout": summary["layout"],
    }
    record["tokens"] = tokens_per_step * record["steps"]
    record["flops"] = 6 * record["n_params"] * record["tokens"]
    grow_record = here / "init" / "dstk_grow.json"
    if grow_record.is_file():
        record["grow"] = json.loads(grow_record.read_text())
    return record


def run_schedule(s: Schedule, dry_run: bool = False, echo: Any = print) -> dict[str, Any]:
    """Run every stage's commands in order (or only print them); write and return RUN_DIR/progressive.json.

    A stage whose `summary.json` exists is not run again, nor a growth whose record exists: after a failure,
    rerunning the schedule continues with the first unfinished stage."""
    from toolkit.plan.load import load_model

    specs = [load_model(stage.model) for stage in s.stages]  # fail fast on a bad description
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    stages = []
    for i in range(len(s.stages)):
        here = Path(s.run_dir) / f"stage{i}"
        if (
            not dry_run and (here / "summary.json").is_file()
        ):  # a rerun continues after the last finished stage
            echo(f"[stage {i}] finished before ({here / 'summary.json'}): skipped")
            saved = here / "stage_record.json"
            stages.append(json.loads(saved.read_text()) if saved.is_file() else _stage_record(s, i, specs[i]))
            continue
        started = time.perf_counter()
        for name, cmd in stage_commands(s, i).items():
            echo(f"[stage {i}] " + " ".join(cmd[2:]).replace("toolkit.cli", "dstk", 1))
            if dry_run or (name == "grow" and (here / "init" / "dstk_grow.json").is_file()):
                continue
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                echo((proc.stdout + proc.stderr)[-3000:])
                raise UserError(
                    f"--schedule: stage {i}: dstk {cmd[3]} failed (exit {proc.returncode}), output above"
                )
            if name == "grow":
                echo(proc.stdout.rstrip())
        if not dry_run:
            stages.append({**_stage_record(s, i, specs[i]), "wall_s": time.perf_counter() - started})
            (here / "stage_record.json").write_text(json.dumps(stages[-1], indent=2, sort_keys=True) + "\n")
            losses = stages[-1]["losses"]
            echo(
                f"[stage {i}] {specs[i].name}: loss {losses[0]:.4f} → {losses[-1]:.4f} over {len(losses)} steps"
            )
    result = {"schedule": s.model_dump(), "stages": stages}
    if stages:
        result["total_tokens"] = sum(st["tokens"] for st in stages)
        result["total_flops"] = sum(st["flops"] for st in stages)
        path = Path(s.run_dir) / "progressive.json"
        path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        echo(f"wrote {path}")
    return result
