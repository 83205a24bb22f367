"""`dstk validate`: check any DeepSpeed config with DeepSpeed's own classes for a world size; report all problems."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="DeepSpeed JSON config")
    parser.add_argument(
        "--world-size", type=int, required=True, metavar="N", help="ranks the job will run on"
    )
    parser.add_argument("--accelerator", default=None, help="accelerator the job runs on (cpu rejects fp16)")


def run(args: argparse.Namespace) -> int:
    from toolkit.errors import UserError
    from toolkit.integrations.validate import validate_config
    from toolkit.plan.load import read_mapping

    if args.world_size <= 0:
        raise UserError(f"--world-size: {args.world_size} must be a positive number of ranks")
    cfg = read_mapping(args.file)
    problems = validate_config(cfg, args.world_size, args.accelerator)
    if not problems:
        print(f"{args.file}: valid for world size {args.world_size}")
        return 0
    print(f"{args.file}: {len(problems)} problem(s) for world size {args.world_size}:")
    for p in problems:
        print(f"  - {p}")
    print(f"dstk validate: error: {args.file}: {len(problems)} problem(s), see above", file=sys.stderr)
    return 2
