"""`dstk train`: train a model description with a DeepSpeed config on the ranks a launcher started.

Run it through `dstk launch` (or the `deepspeed` launcher directly); alone it is a one-rank job.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from toolkit.commands import add_model_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument(
        "--config", type=Path, required=True, metavar="FILE", help="DeepSpeed JSON (dstk config writes one)"
    )
    parser.add_argument(
        "--data",
        type=Path,
        metavar="DIR",
        help="output of dstk data prepare (default: the generated demo corpus, prepared in the run dir)",
    )
    parser.add_argument(
        "--steps", type=int, metavar="N", help="optimizer steps (default: the schedule's total_num_steps)"
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path("runs/train"),
        metavar="DIR",
        help="metrics.jsonl, summary.json and the default data go here",
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, metavar="DIR", help="save (and resume) checkpoints here"
    )
    parser.add_argument(
        "--save-every",
        type=int,
        metavar="K",
        help="checkpoint every K steps and at the end (default: the plan's Young/Daly interval)",
    )
    parser.add_argument("--keep-last", type=int, default=3, metavar="K", help="complete checkpoints to keep")
    parser.add_argument(
        "--resume",
        default="never",
        metavar="auto|never|TAG",
        help="auto: continue from the newest complete checkpoint",
    )
    parser.add_argument(
        "--init-from", type=Path, metavar="DIR", help="start from a local save_pretrained directory"
    )
    parser.add_argument(
        "--eval-every", type=int, default=0, metavar="N", help="held-out loss and perplexity every N steps"
    )
    parser.add_argument(
        "--eval-rows", type=int, default=64, metavar="N", help="validation sequences per evaluation"
    )
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="evaluate the (resumed or --init-from) model once on the validation split and stop",
    )
    parser.add_argument("--log-every", type=int, default=10, metavar="N", help="log metrics every N steps")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights, data order and dropout")
    parser.add_argument(
        "--cluster",
        metavar="C",
        help="cluster to predict against (default: the cpu preset on the CPU accelerator)",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.add_argument("--fault-after-save-shards", type=int, metavar="STEP", help=argparse.SUPPRESS)
    parser.add_argument("--crash-at-step", type=int, metavar="STEP", help=argparse.SUPPRESS)
    parser.add_argument("--crash-rank", type=int, default=0, metavar="RANK", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    import os

    from toolkit.runtime import keep_large_blocks_in_mmap

    keep_large_blocks_in_mmap()  # before torch is imported: see its docstring

    from toolkit.commands import model_from_args
    from toolkit.errors import UserError
    from toolkit.load import load_cluster, read_mapping
    from toolkit.train import TrainRun, main
    from toolkit.trainer import LoopOptions

    model = model_from_args(args)
    config = read_mapping(args.config)
    steps = args.steps or ((config.get("scheduler") or {}).get("params") or {}).get("total_num_steps")
    if not steps or steps <= 0:
        raise UserError("--steps: give a positive number of steps (the config's scheduler has none)")
    if args.save_every is None:
        planned = (config.get("dstk") or {}).get("checkpoint_interval_steps", 0)
        args.save_every = min(planned, steps) if args.checkpoint_dir else 0
    for flag in ("save_every", "keep_last", "eval_every", "eval_rows", "log_every"):
        if getattr(args, flag) < 0:
            raise UserError(f"--{flag.replace('_', '-')}: must not be negative")
    if args.init_from is not None and not args.init_from.is_dir():
        raise UserError(f"--init-from: {args.init_from} is not a directory")
    if args.data is not None and not args.data.is_dir():
        raise UserError(f"--data: {args.data} is not a directory")
    if args.resume not in ("auto", "never") and args.checkpoint_dir is None:
        raise UserError("--resume: needs --checkpoint-dir")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cluster = None
    if args.cluster:
        cluster = load_cluster(args.cluster)
    elif (config.get("dstk") or {}).get("layout", {}).get("world_size", world) == world:
        cluster = load_cluster("cpu", {"gpus_per_node": world}) if _cpu_only() else None
    os.environ.setdefault("WANDB_MODE", "offline")  # offline unless the user configured wandb
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
    )
    main(
        TrainRun(
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
        )
    )
    return 0


def _cpu_only() -> bool:
    import torch

    return not torch.cuda.is_available()
