"""`dstk validate`: judge any DeepSpeed config, as DeepSpeed would, for a job's world size and accelerator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import get_args

from toolkit.plan.specs import Accelerator, Precision


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="DeepSpeed config (JSON, or hjson as DeepSpeed reads it)")
    parser.add_argument(
        "--world-size", type=_positive, required=True, metavar="N", help="ranks the job will run on"
    )
    parser.add_argument(
        "--accelerator",
        choices=get_args(Accelerator),
        default="cuda",
        help="accelerator the job runs on, not this host's (cpu refuses fp16; GPUDirect Storage needs cuda)",
    )
    mp = parser.add_argument_group(
        "model parallelism set by the launcher (Megatron-DeepSpeed); default: what the config says"
    )
    mp.add_argument("--tp", type=_positive, metavar="N", help="tensor-parallel degree")
    mp.add_argument("--pp", type=_positive, metavar="N", help="pipeline stages")
    mp.add_argument("--sp", type=_positive, metavar="N", help="Ulysses sequence-parallel degree")
    auto = parser.add_argument_group('facts that fill "auto" fields as HF Trainer/Accelerate would')
    auto.add_argument("--micro-batch", type=_positive, metavar="N", help="per_device_train_batch_size")
    auto.add_argument("--grad-accum", type=_positive, metavar="N", help="gradient_accumulation_steps")
    auto.add_argument("--model", help="model preset or file, for the hidden-size-based ZeRO sizes")
    auto.add_argument("--precision", choices=get_args(Precision), help="fills fp16/bf16.enabled")


def run(args: argparse.Namespace) -> int:
    from toolkit.integrations.ds_auto import RunFacts
    from toolkit.integrations.ds_input import read_ds_config
    from toolkit.integrations.ds_layout import ModelParallel
    from toolkit.integrations.validate import validate_config

    cfg = read_ds_config(args.file)
    hidden = None
    if args.model:
        from toolkit.plan.load import load_model

        hidden = load_model(args.model).hidden_size
    parallel = ModelParallel.of(cfg, args.tp, args.pp, args.sp)
    facts = RunFacts(args.micro_batch, args.grad_accum, hidden, args.precision)
    verdict = validate_config(cfg, args.world_size, args.accelerator, parallel, facts)
    job = f"world size {args.world_size} on {args.accelerator}"
    if (parallel.layout_tp, parallel.pp, parallel.sp) != (1, 1, 1):
        job += f" (tp {parallel.layout_tp} × pp {parallel.pp} × sp {parallel.sp})"
    for note in verdict.notes:
        print(f"  note: {note}")
    for warning in verdict.warnings:
        print(f"  warning: {warning}")
    if not verdict.problems:
        print(f"{args.file}: valid for {job}")
        return 0
    print(f"{args.file}: {len(verdict.problems)} problem(s) for {job}:")
    for p in verdict.problems:
        print(f"  - {p.text}")
    print(
        f"dstk validate: error: {args.file}: {len(verdict.problems)} problem(s), see above", file=sys.stderr
    )
    return 2
