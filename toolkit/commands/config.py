"""`dstk config`: write the DeepSpeed config for a layout (given by flags, or chosen with --plan), and the
settings of the runtime that will run it: HF Trainer (`--hf-trainer`), Accelerate (`--accelerate`) or
Megatron-DeepSpeed (`--megatron`); see :mod:`toolkit.integrations.targets`. Megatron-LM's Megatron-Core
(`--megatron-core`, `--target megatron-core`) reads no DeepSpeed JSON: its `pretrain_gpt.py` arguments are
the output (:mod:`toolkit.integrations.megatron_core`).

Imports DeepSpeed lazily, only to validate what it writes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from toolkit.commands import (
    add_allow_fp8_arg,
    add_cluster_args,
    add_layout_args,
    add_model_args,
    add_target_arg,
    cluster_from_args,
    layout_request_from_args,
    model_from_args,
    scopes_from_args,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_cluster_args(parser)
    add_layout_args(parser)
    add_target_arg(parser)
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="FILE",
        help="where to write the DeepSpeed JSON ('-' for stdout); with --megatron-core, the pretrain_gpt.py "
        "arguments (also printed)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="let the planner choose the layout; layout flags become constraints",
    )
    add_allow_fp8_arg(parser)
    _add_target_args(parser)
    parser.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="skip the check with DeepSpeed's own config classes",
    )
    _add_option_args(parser)


def _add_target_args(parser: argparse.ArgumentParser) -> None:
    targets = parser.add_argument_group("runtime the config is for (default: dstk train)")
    targets.add_argument(
        "--hf-trainer",
        action="store_true",
        help="HF Trainer: 'auto' where the Trainer fills values from TrainingArguments, and those arguments "
        "in FILE's stem + .training_args.json",
    )
    targets.add_argument(
        "--accelerate",
        action="store_true",
        help="also write an Accelerate config (FILE's stem + .accelerate.yaml) for accelerate launch --config_file",
    )
    targets.add_argument(
        "--megatron",
        action="store_true",
        help="Megatron-DeepSpeed: print the pretrain_gpt.py arguments; FILE is the config they name "
        "(implies --target megatron)",
    )
    targets.add_argument(
        "--megatron-core",
        action="store_true",
        help="Megatron-LM (Megatron-Core, d98e8a64): print its pretrain_gpt.py arguments and write them to FILE, "
        "shell-quoted; no DeepSpeed JSON (implies --target megatron-core, which implies it)",
    )


def _add_option_args(parser: argparse.ArgumentParser) -> None:
    """The ConfigOptions fields, one flag each (OPTION_FLAGS names them)."""
    from toolkit.integrations.ds_config import ConfigOptions

    group = parser.add_argument_group("training options written into the config")
    for name, flag in OPTION_FLAGS.items():
        field = ConfigOptions.model_fields[name]
        text = (field.description or "").replace("%", "%%")  # argparse %-formats help ("20 % of ...")
        if field.annotation is bool:
            group.add_argument(flag, dest=name, action="store_true", default=None, help=text)
        else:
            kind = float if name == "lr" else int if "steps" in name or name == "freeze_step" else str
            group.add_argument(flag, dest=name, type=kind, metavar="X", help=text)
    group.add_argument(
        "--tokens",
        metavar="N",
        help="training tokens (300e9, 3e11, 300B, 1.5T): the schedule spans them, tokens / (global batch × "
        "sequence length) steps, as dstk plan --tokens sizes it (instead of --train-steps)",
    )


def _schedule_tokens(args: argparse.Namespace, model: Any, layout: Any) -> None:
    """--tokens as the schedule's steps, the way dstk plan --tokens counts them (integrations/plan_answer)."""
    import math

    from toolkit.errors import UserError
    from toolkit.plan.training_cost import parse_tokens

    if args.tokens is None:
        return
    if args.train_steps is not None:
        raise UserError("--tokens: sizes the schedule as --train-steps does; give one")
    tokens = parse_tokens(args.tokens)
    args.train_steps = max(1, math.ceil(tokens / (layout.global_batch_size * model.seq_length)))


OPTION_FLAGS = {
    "lr": "--lr",
    "train_steps": "--train-steps",
    "warmup_steps": "--warmup-steps",
    "log_dir": "--log-dir",
    "job_name": "--job-name",
    "wandb": "--wandb",
    "comms_logger": "--comms-logger",
    "flops_profiler": "--flops-profiler",
    "nvme_path": "--nvme-path",
    "freeze_step": "--freeze-step",
}


def _check_targets(args: argparse.Namespace) -> None:
    from toolkit.errors import UserError

    if args.megatron and args.target == "megatron-core":
        raise UserError("--megatron: writes for Megatron-DeepSpeed (--target megatron); use --megatron-core")
    args.megatron_core = args.megatron_core or args.target == "megatron-core"
    if args.megatron_core and (args.megatron or args.hf_trainer or args.accelerate):
        raise UserError(
            "--megatron-core: Megatron-LM has its own launcher, trainer and no DeepSpeed JSON; it cannot be "
            "combined with --megatron, --hf-trainer or --accelerate"
        )
    if args.megatron and (args.hf_trainer or args.accelerate):
        raise UserError(
            "--megatron: Megatron-DeepSpeed has its own launcher and trainer; it cannot be combined with "
            "--hf-trainer or --accelerate"
        )
    if args.megatron_core and args.target == "megatron":
        raise UserError("--megatron-core: writes for --target megatron-core; drop --target megatron")
    if args.megatron_core:
        given = [OPTION_FLAGS[k] for k in DEEPSPEED_ONLY_OPTIONS if getattr(args, k) is not None]
        if given:
            raise UserError(
                f"{', '.join(given)}: DeepSpeed config options; Megatron-LM takes its own logging and profiling "
                "flags (add them to the printed arguments)"
            )
    if str(args.output) == "-" and (args.hf_trainer or args.accelerate or args.megatron):
        raise UserError(
            "-o: --hf-trainer/--accelerate write files next to the DeepSpeed JSON, and --megatron prints its "
            "arguments on stdout; give -o FILE"
        )


DEEPSPEED_ONLY_OPTIONS = (
    "log_dir",
    "job_name",
    "wandb",
    "comms_logger",
    "flops_profiler",
    "nvme_path",
    "freeze_step",
)
"""Options that only shape the DeepSpeed JSON (its monitors, profilers, swap path, 1-bit warm-up)."""


def _megatron_defaults(args: argparse.Namespace, target: str) -> None:
    """Megatron runs TP with its sequence parallelism and always with a vocabulary-parallel embedding, and
    Megatron-Core Transformer Engine's fused attention (`--attention-backend auto`): the planner assumes them
    for these targets, so an explicit layout does too unless told otherwise."""
    args.target = target
    if not args.plan:
        tp = args.tp or 1
        for name in ("tp_sequence_parallel", "tp_vocab_parallel"):
            if getattr(args, name) is None:
                setattr(args, name, tp > 1)
        if target == "megatron-core" and args.flash_attention is None:
            args.flash_attention = True


def _companion(path: Path, suffix: str) -> Path:
    """`ds.json` -> `ds<suffix>` beside it (`ds.training_args.json`, `ds.accelerate.yaml`)."""
    stem = path.name[: -len(".json")] if path.name.endswith(".json") else path.name
    return path.with_name(stem + suffix)


def _write_text(path: Path, text: str) -> None:
    """Atomically (as ds_config.write does), so a failed run never leaves half a file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _write_targets(
    args: argparse.Namespace, model: Any, cluster: Any, layout: Any, cfg: dict[str, Any]
) -> None:
    """Write the files of the runtime(s) asked for (see toolkit.integrations.targets); everything is built first, so a
    refusal leaves no partial output behind."""
    from toolkit.integrations import ds_config
    from toolkit.integrations.targets import without_dstk_block

    files: dict[Path, str] = {args.output: ds_config.dumps(without_dstk_block(cfg))}
    stdout = ""
    if args.megatron:
        from toolkit.integrations import megatron

        megatron_cfg = megatron.megatron_ds_config(cfg, layout)
        if args.validate:
            # DeepSpeed sees Megatron's mpu: only the data-parallel ranks count in its batch check
            _validate(megatron_cfg, layout, cluster.accelerator, model_parallel=True)
        files[args.output] = ds_config.dumps(megatron_cfg)
        stdout = shlex.join(megatron.megatron_args(model, cluster, layout, cfg, args.output)) + "\n"
        if layout.precision == "fp8":
            print(f"note: {megatron.FP8_NOTE}", file=sys.stderr)
    elif args.hf_trainer:
        from toolkit.integrations.hf_trainer import hf_trainer_files

        hf_cfg, training_args = hf_trainer_files(cfg, cluster, layout)
        if args.validate:  # its "auto" fields filled as the Trainer will fill them from training_args
            _validate(hf_cfg, layout, cluster.accelerator, hidden_size=model.hidden_size)
        files[args.output] = ds_config.dumps(hf_cfg)
        files[_companion(args.output, ".training_args.json")] = ds_config.dumps(training_args)
    if args.accelerate:
        from toolkit.integrations import accelerate

        yaml_text = accelerate.dumps(accelerate.accelerate_config(cluster, layout, args.output))
        files[_companion(args.output, ".accelerate.yaml")] = yaml_text
    for path, text in files.items():
        _write_text(path, text)
    sys.stdout.write(stdout)
    print(f"wrote {', '.join(map(str, files))} ({' '.join(layout.flags())})", file=sys.stderr)


def _validate(
    cfg: dict[str, Any],
    layout: Any,
    accelerator: str,
    model_parallel: bool = False,
    hidden_size: int | None = None,
) -> None:
    """DeepSpeed's verdict on what dstk wrote, for the layout's world size (its TP/PP/SP given when the
    launcher sets them rather than the file); "auto" fields filled as HF would fill them for this layout."""
    from toolkit.integrations.ds_auto import RunFacts
    from toolkit.integrations.ds_layout import ModelParallel
    from toolkit.integrations.validate import validate_config

    # under Megatron's mpu DeepSpeed counts the data-parallel ranks only (its groups take TP, PP and SP)
    world, parallel = (layout.dp, ModelParallel()) if model_parallel else (layout.world_size, None)
    facts = RunFacts(
        layout.micro_batch_size, layout.gradient_accumulation_steps, hidden_size, layout.precision
    )
    verdict = validate_config(cfg, world, accelerator, parallel, facts)
    if verdict.problems:  # dstk generated something DeepSpeed refuses: our bug, not the user's
        raise RuntimeError("generated config rejected by DeepSpeed: " + "; ".join(verdict.texts))


def _check_inputs(args: argparse.Namespace, model: Any, cluster: Any) -> None:
    """What a target runtime refuses whatever the layout (before planning)."""
    if args.accelerate:
        from toolkit.integrations.accelerate import check_cluster

        check_cluster(cluster)
    if args.megatron:
        from toolkit.integrations.megatron import check_model

        check_model(model)
    if args.megatron_core:  # before planning: every layout would be refused for the same reason
        from toolkit.errors import UserError
        from toolkit.plan.core_rules import core_model_problem

        problem = core_model_problem(model, cluster)
        if problem:
            raise UserError(problem)


def _check_layout(args: argparse.Namespace, model: Any, layout: Any) -> None:
    """What a target runtime cannot run as planned (ecosystem.hf_trainer / ecosystem.megatron)."""
    if args.hf_trainer or args.accelerate:
        from toolkit.integrations.hf_trainer import check_layout

        check_layout(model, layout, "--hf-trainer" if args.hf_trainer else "--accelerate")
    if args.megatron:
        from toolkit.integrations.megatron import check_layout as check_megatron

        check_megatron(model, layout)
    if args.megatron_core:
        from toolkit.integrations.megatron_core_run import check_layout as check_core

        check_core(model, layout)


def _priced_layout(args: argparse.Namespace, model: Any, cluster: Any) -> Any:
    """The estimate of the layout the flags describe, or with --plan of the planner's choice under them as
    constraints (priced once: the config and the memory warning both read it)."""
    from toolkit.plan.cost.estimate import estimate
    from toolkit.plan.rules import resolve_layout

    request = layout_request_from_args(args)
    scopes = scopes_from_args(args)
    if not args.plan:
        if args.allow_fp8:
            from toolkit.errors import UserError

            raise UserError("--allow-fp8: the planner weighs fp8; give --plan, or --precision fp8")
        return estimate(model, cluster, resolve_layout(model, cluster, request, scopes))
    from toolkit.plan.planner import nothing_fits_message, plan
    from toolkit.plan.query import PlanQuery

    query = PlanQuery.pinning(request, scopes=scopes, allow_fp8=args.allow_fp8)
    if args.hf_trainer or args.accelerate:  # layouts they cannot run are not worth planning
        query = query.model_copy(update={"pp": query.pp or 1, "sp": query.sp or 1})
    result = plan(model, cluster, query)
    if result is None:
        raise nothing_fits_message(model, cluster, query)
    return result.best.estimate


def run(args: argparse.Namespace) -> int:
    from toolkit.integrations import ds_config
    from toolkit.plan.load import build

    _check_targets(args)
    if str(args.output) != "-":
        from toolkit.paths import output_file

        output_file(args.output, "-o")  # before any work: a folder or an unwritable place, named as given
    if args.megatron or args.megatron_core:
        _megatron_defaults(args, "megatron-core" if args.megatron_core else "megatron")
    if args.target in ("megatron", "megatron-core") and not args.plan and args.fused_kernels is None:
        # Megatron's fused kernels (and its CoreAttention), as the planner assumes for this target
        args.fused_kernels = True
    model, cluster = model_from_args(args), cluster_from_args(args)
    _check_inputs(args, model, cluster)
    predicted = _priced_layout(args, model, cluster)
    layout = predicted.layout
    _check_layout(args, model, layout)
    _schedule_tokens(args, model, layout)
    options = build(
        ds_config.ConfigOptions,
        {k: getattr(args, k) for k in OPTION_FLAGS if getattr(args, k) is not None},
        "config options",
        labels=OPTION_FLAGS,
    )
    cfg = ds_config.build_ds_config(model, cluster, predicted, options)
    if not predicted.fits:
        print(
            f"dstk config: warning: predicted {predicted.memory.total / 2**30:.1f} GiB per GPU exceeds "
            f"{cluster.gpu_memory_gib:g} GiB (or host/NVMe capacity); try dstk plan",
            file=sys.stderr,
        )
    if args.megatron_core:  # no DeepSpeed JSON to validate: cfg gives the optimizer and schedule numbers
        _write_megatron_core(args, model, cluster, layout, cfg)
        return 0
    if args.validate:
        _validate(cfg, layout, cluster.accelerator)
    _write(args, model, cluster, layout, cfg)
    return 0


def _write_megatron_core(
    args: argparse.Namespace, model: Any, cluster: Any, layout: Any, cfg: dict[str, Any]
) -> None:
    """The pretrain_gpt.py arguments on stdout, and in -o FILE unless `-`, one shell-quoted line; the notes
    (what the model description lacks, vocabulary padding, the launcher's environment) on stderr."""
    from toolkit.integrations import megatron_core

    line = shlex.join(megatron_core.megatron_core_args(model, cluster, layout, cfg)) + "\n"
    if str(args.output) != "-":
        _write_text(args.output, line)
    sys.stdout.write(line)
    for note in megatron_core.notes(model, cluster, layout):
        print(f"note: {note}", file=sys.stderr)
    where = "" if str(args.output) == "-" else f"wrote {args.output} "
    print(f"{where}({megatron_core.LABEL}; {' '.join(layout.flags())})", file=sys.stderr)


def _write(args: argparse.Namespace, model: Any, cluster: Any, layout: Any, cfg: dict[str, Any]) -> None:
    """The config (with --hf-trainer/--accelerate/--megatron, what those runtimes read) to -o, or stdout."""
    from toolkit.integrations import ds_config

    if args.hf_trainer or args.accelerate or args.megatron:
        _write_targets(args, model, cluster, layout, cfg)
    elif str(args.output) == "-":
        sys.stdout.write(ds_config.dumps(cfg))
    else:
        ds_config.write(cfg, args.output)
        print(f"wrote {args.output} ({' '.join(layout.flags())})", file=sys.stderr)
