"""Everything `dstk train` needs, checked before any rank starts (no torch: descriptions and manifests are
files): `prepare_run` turns train's flags into a checked TrainRun, and `dstk launch` calls it on the login
node before it starts a rank or writes an sbatch script.

Found on the ranks, a mistake costs every rank's start-up (~15 s, the JIT builds on a first run) and is
printed once per rank under the launcher's log, or only after training (an unwritable checkpoint folder is met
at the first save). Here it is one line and exit 2: a train flag misspelt, the data missing or prepared for
another model (vocabulary, sequence length), a checkpoint or run folder that cannot be written, a resume that
would fail or silently continue on other data.

A checkpoint's `dstk_manifest.json` records the step, the world size, the layout, the model and the data
(tokenizer hash, sequence length, rows) it was written with. Resuming it under another ZeRO stage, world size
or model fails deep inside `load_checkpoint` on every rank; resuming on other data trains on without a word;
a resume past `--steps` does nothing at all: `check_resume` makes each one line, with the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.run.checkpoint import MANIFEST, check, complete_tags, newest_complete
from toolkit.run.folders import check_checkpoint_dir

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
    data: dict[str, Any] | None = None,
    new_data: bool = False,
) -> None:
    """One-line UserError when resuming would fail, do nothing, or continue on other data than the checkpoint
    was trained on (unless `new_data`); silent when it will work. `steps` None: the run trains nothing
    (--eval-only), so any step is fine. `data`: this run's `data_fingerprint`, None when not known yet."""
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
    old_data = manifest.get("data")
    if old_data and data and not new_data:
        differs = [k for k in DATA_IDENTITY if old_data.get(k) != data.get(k)]
        if differs:
            what = ", ".join(f"{k} {old_data.get(k)} → {data.get(k)}" for k in differs[:3])
            raise UserError(
                f"--data: {where} was trained on other data ({what}); resume with the data it was trained on, "
                "or pass --new-data to continue the model on this data from its first row"
            )


DATA_IDENTITY = ("tokenizer_hash", "seq_length", "vocab_size", "rows")
"""What identifies a prepared dataset (its manifest.json): the tokenizer, the packing, the rows it holds."""


def data_fingerprint(data_dir: Path | None) -> dict[str, Any] | None:
    """The identity of a `dstk data prepare` output (DATA_IDENTITY and the folder), or None without one."""
    if data_dir is None or not (data_dir / "manifest.json").is_file():
        return None
    from toolkit.data.prepare import MANIFEST

    manifest = json.loads((data_dir / MANIFEST).read_text())
    return {**{k: manifest.get(k) for k in DATA_IDENTITY}, "path": str(data_dir.resolve())}


def check_data(model: Any, data: Path) -> dict[str, Any]:
    """A prepared dataset that this model can train on: its manifest, or one line saying what is wrong."""
    from toolkit.data.integrity import check_files
    from toolkit.data.prepare import MANIFEST
    from toolkit.paths import input_dir

    input_dir(data, "--data", "the folder dstk data prepare wrote")
    path = data / MANIFEST
    if not path.is_file():
        raw = sorted(p.name for p in data.iterdir())[:3]
        seen = f" (it holds {', '.join(raw)})" if raw else " (it is empty)"
        raise UserError(
            f"--data: {data} has no {MANIFEST}{seen}; make it with dstk data prepare --out {data}"
        )
    manifest = json.loads(path.read_text())
    if not (manifest.get("rows") or {}).get("train"):
        raise UserError(f"--data: {data} holds no training sequences (rows.train is 0 in its {MANIFEST})")
    if manifest["vocab_size"] > model.vocab_size:
        raise UserError(
            f"--data: tokenizer vocabulary {manifest['vocab_size']} exceeds the model's vocab_size "
            f"{model.vocab_size}; prepare the data with --train-tokenizer {model.vocab_size} or fewer"
        )
    if manifest["seq_length"] > model.max_position_embeddings and model.position_embedding == "learned":
        raise UserError(
            f"--data: sequences of {manifest['seq_length']} exceed max_position_embeddings "
            f"{model.max_position_embeddings}; prepare the data with --seq-length {model.max_position_embeddings}"
        )
    # every shard whole, the tokenizer the one it was tokenized with (toolkit.data.integrity)
    check_files(data, manifest)
    return manifest


def schedule_note(steps: int, config: dict[str, Any]) -> str | None:
    """A sentence when `--steps` runs past the config's learning-rate schedule (DeepSpeed's WarmupCosineLR
    holds the floor after total_num_steps): the run trains on, at a rate the user may not expect."""
    from toolkit.integrations.ds_input import scheduled_steps

    planned = scheduled_steps(config)
    if not isinstance(planned, int) or steps <= planned:
        return None
    floor = (config.get("scheduler") or {}).get("params", {}).get("cos_min_ratio")
    at = f"{floor:g} × the peak" if isinstance(floor, (int, float)) else "the schedule's floor"
    return (
        f"--steps {steps} runs past the config's schedule (total_num_steps {planned}): steps {planned + 1}–{steps} "
        f"train at {at}; for a schedule over the whole run: dstk config ... --train-steps {steps}"
    )


def prepare_run(args: Any, world: int, cluster: Any = None) -> tuple[Any, list[str]]:
    """`dstk train`'s flags → (a checked TrainRun, notes to say once). Raises a one-line UserError for any
    mistake a rank would otherwise meet; reads and writes nothing but probe files. `cluster`: the one `dstk
    launch` starts the ranks on (default: --cluster, else this machine when the config's world is this one)."""
    from toolkit.host.local import load_cluster
    from toolkit.integrations.ds_input import read_ds_config, scheduled_steps
    from toolkit.integrations.ds_layout import request_from_config
    from toolkit.integrations.dstk_block import read_dstk_block
    from toolkit.paths import input_dir, input_file, output_dir
    from toolkit.plan.load import model_from
    from toolkit.run.loop_state import LoopOptions, TrainRun
    from toolkit.run.stability import Fault
    from toolkit.run.trace import trace_announced
    from toolkit.run.train_flags import batching_options, guard_options

    model = model_from(args.model, args.params, args.seq_length, tracer=trace_announced)
    config = read_ds_config(input_file(args.config, "--config", "a DeepSpeed JSON config"))
    block = read_dstk_block(config)
    if args.steps is not None and args.steps <= 0:
        raise UserError(f"--steps: {args.steps} must be positive (omit it for the config's scheduled steps)")
    steps = args.steps or scheduled_steps(config)
    if not isinstance(steps, int) or steps <= 0:
        raise UserError("--steps: give a positive number of steps (the config's scheduler has none)")
    for flag in ("save_every", "keep_last", "eval_every", "eval_rows", "log_every"):
        if (getattr(args, flag) or 0) < 0:
            raise UserError(f"--{flag.replace('_', '-')}: must not be negative")
    if not args.straggler_ratio > 1:
        raise UserError(
            f"--straggler-ratio: must be above 1 (a rank as fast as the others), got {args.straggler_ratio:g}"
        )
    if args.checkpoint_dir is None:
        for flag, given in (("--save-every", args.save_every), ("--resume", args.resume != "never")):
            if given:
                raise UserError(
                    f"{flag}: needs --checkpoint-dir (where the checkpoints are written and read)"
                )
    else:
        output_dir(args.checkpoint_dir, "--checkpoint-dir")
    output_dir(args.run_dir, "--run-dir")
    if args.save_every is None:
        planned = block.checkpoint_interval_steps
        args.save_every = min(planned, steps) if args.checkpoint_dir else 0
    async_save, snapshot_every = checkpoint_tiers(args, block, model)
    if args.init_from is not None:
        input_dir(args.init_from, "--init-from", "a save_pretrained folder")
        if not (args.init_from / "config.json").is_file():  # else every rank fails at start-up
            raise UserError(
                f"--init-from: {args.init_from} has no config.json (expected a save_pretrained directory, "
                "e.g. what dstk export or dstk grow writes)"
            )
        from toolkit.run.models import check_init_from

        check_init_from(model, args.init_from)
    manifest = check_data(model, args.data) if args.data is not None else None
    request = request_from_config(config, world)  # DeepSpeed's batch arithmetic for this world, before torch
    notes = [n for n in (schedule_note(steps, config), _planned_for(block, model)) if n]
    batching = batching_options(args, config)
    notes += _data_notes(args, model, manifest, request.global_batch_size, steps, batching is not None)
    cleared = check_checkpoint_dir(args.checkpoint_dir, args.resume, args.overwrite_checkpoints)
    notes += [cleared] if cleared else []
    steps_left = (
        None if args.eval_only else steps
    )  # --eval-only trains nothing: a checkpoint at --steps is fine
    check_resume(
        args.checkpoint_dir,
        args.resume,
        steps_left,
        world,
        request.model_dump(),
        model.model_dump(),
        data_fingerprint(args.data),
        args.new_data,
    )
    if cluster is None and args.cluster:
        cluster = load_cluster(args.cluster)
    elif cluster is None and (block.layout is None or block.layout.world_size == world):
        cluster = load_cluster("local", {"gpus_per_node": world})
    from toolkit.run.fp8 import preflight

    preflight(model, cluster, request)
    loop = LoopOptions(
        steps=steps,
        log_every=max(args.log_every, 1),
        eval_every=args.eval_every,
        eval_rows=args.eval_rows,
        eval_only=args.eval_only,
        save_every=args.save_every,
        seed=args.seed,
        progress=args.progress,
        fault_after_first_shard_at=args.fault_after_save_shards,
        crash_at_step=args.crash_at_step,
        crash_rank=args.crash_rank,
        crash_during=args.crash_during,
        slow_snapshot_s=args.slow_snapshot,
        async_save=async_save,
        snapshot_every=snapshot_every,
        guard=guard_options(args),
        faults=tuple(Fault.parse(f) for f in args.inject_fault or ()),
        straggler_ratio=args.straggler_ratio,
        on_save_error=args.on_save_error,
        batching=batching,
        new_data=args.new_data,
    )
    run = TrainRun(
        model=model,
        config=config,
        data=args.data,
        run_dir=args.run_dir,
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
        init_from=args.init_from,
        cluster=cluster,
        keep_last=args.keep_last,
        loop=loop,
        overwrite_checkpoints=args.overwrite_checkpoints,
        lora=lora_spec(args.lora, block.layout.lora if block.layout else None),
    )
    return run, notes


def _data_notes(
    args: Any, model: Any, manifest: Any, global_batch: int | None, steps: int, budget: bool
) -> list[str]:
    """Rows against one global batch (refused when fewer), the epochs `--steps` reads, the data's sequence
    length against the model's: what the pre-flight can know from the manifest (toolkit.run.data_fit)."""
    from toolkit.run.data_fit import check_rows, epochs_note, seq_length_note

    if manifest is None:
        return []
    check_rows(args.data, manifest, global_batch, budget)
    found = (epochs_note(manifest, global_batch, steps, budget), seq_length_note(model, manifest))
    return [n for n in found if n]


def _planned_for(block: Any, model: Any) -> str | None:
    """A sentence when the config was planned for another model than the one trained: its batch, memory and
    checkpoint plan were made for that one."""
    if block.model and block.model != model.name:
        return (
            f"--config was planned for {block.model}, not {model.name}: its layout and memory plan may not "
            f"hold (dstk config --model {model.name} ... writes one for it)"
        )
    return None


def lora_spec(flag: str | None, planned: str | None) -> str | None:
    """The LoRA spec from --lora or from the plan in the config (`dstk config --lora`); they must agree."""
    from toolkit.plan.lora import parse_lora

    given = parse_lora(flag).text() if flag else None
    planned = parse_lora(planned).text() if planned else None
    if given and planned and given != planned:
        raise UserError(f"--lora: {given} disagrees with the config's plan ({planned}); drop one")
    return given or planned


def checkpoint_tiers(args: Any, block: Any, model: Any = None) -> tuple[bool, int]:
    """(asynchronous saves, shared-memory snapshot interval) from the flags, else the config's plan; with the
    model, /dev/shm must hold the two snapshots the tier keeps while it writes the next."""
    import os

    planned = block.checkpoint
    async_save = args.async_save if args.async_save is not None else planned.asynchronous
    every = args.snapshot_every if args.snapshot_every is not None else planned.snapshot_interval_steps
    if every < 0:
        raise UserError("--snapshot-every: must not be negative")
    if every and args.checkpoint_dir is None:
        raise UserError("--snapshot-every: needs --checkpoint-dir (the snapshots are named after it)")
    nodes = int(
        os.environ.get("CROSS_SIZE") or os.environ.get("SLURM_STEP_NUM_NODES") or 1
    )  # launch.py, or srun
    if every and nodes > 1:
        raise UserError(
            f"--snapshot-every: shared-memory snapshots are node-local and this job spans {nodes} nodes; "
            "use --save-every (and --async-save) for multi-node jobs"
        )
    if every and not os.path.isdir("/dev/shm"):
        raise UserError("--snapshot-every: this host has no /dev/shm")
    if every and model is not None:
        _check_shm_room(model, block.layout)
    return bool(async_save), every


def _check_shm_room(model: Any, layout: Any) -> None:
    """Two snapshots must fit in /dev/shm: a container's default tmpfs (docker: 64 MB) would fail mid-run."""
    import shutil

    from toolkit.plan.checkpoint_interval import checkpoint_bytes
    from toolkit.plan.params import count_params
    from toolkit.plan.units import format_bytes

    need = 2 * (checkpoint_bytes(model, layout) if layout is not None else 16 * count_params(model).total)
    free = shutil.disk_usage("/dev/shm").free
    if need > free:
        raise UserError(
            f"--snapshot-every: the shared-memory tier needs {format_bytes(need)} in /dev/shm (two snapshots "
            f"while the next is written), {format_bytes(free)} free; enlarge it (docker run --shm-size) or "
            "leave --snapshot-every off"
        )


def pick_checkpoint(ckpt_dir: Path, tag: str | None) -> str:
    """The tag `dstk export` / `dstk checkpoint convert` read (--tag, else the newest complete one), or one
    line naming what the user gave wrong: a folder that is one checkpoint (a tag) rather than the folder of
    checkpoints, a tag that is not there, a folder with none complete. Manifests only: no torch."""
    from toolkit.paths import input_dir

    input_dir(ckpt_dir, "--checkpoint", "dstk train's --checkpoint-dir")
    if (ckpt_dir / MANIFEST).is_file() or (tag is None and ckpt_dir.name.startswith("step")):
        raise UserError(
            f"--checkpoint: {ckpt_dir} is one checkpoint, not a folder of them; give "
            f"--checkpoint {ckpt_dir.parent} --tag {ckpt_dir.name}"
        )
    complete = complete_tags(ckpt_dir, verify_hashes=False)
    if tag is None:
        if not complete:
            raise UserError(f"--checkpoint: {ckpt_dir} holds no complete checkpoint")
        return complete[0]
    if not (ckpt_dir / tag).is_dir():
        hint = f"complete ones: {', '.join(complete[:4])}" if complete else "it holds no complete checkpoint"
        raise UserError(f"--tag: {ckpt_dir} has no checkpoint {tag}; {hint}")
    problem = check(ckpt_dir / tag)
    if problem:
        raise UserError(f"--tag: {ckpt_dir / tag} is not a complete checkpoint: {problem}")
    return tag
