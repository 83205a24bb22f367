"""`dstk launch`: write the hostfile, build the `deepspeed` launcher command, run it (or print it).

With no script after `--`, the program is `dstk train` with the given config; `--max-restarts N` reruns a
failed job up to N times, resuming from the newest complete checkpoint each time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from toolkit.commands import add_cluster_args, cluster_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_args(parser)
    parser.add_argument("--config", type=Path, metavar="FILE", help="DeepSpeed JSON for dstk train")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path("runs/launch"),
        metavar="DIR",
        help="where the hostfile, the resolved cluster and the launch log go",
    )
    parser.add_argument("--master-port", type=int, default=29500, metavar="P", help="rendezvous port")
    parser.add_argument("--include", metavar="NODES", help="deepspeed --include resource list")
    parser.add_argument("--exclude", metavar="NODES", help="deepspeed --exclude resource list")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="rerun a failed job up to N times, resuming from the newest complete checkpoint",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        help="after --: SCRIPT ARGS, -m MODULE ARGS, or dstk train ARGS (the default)",
    )


def _program(args: argparse.Namespace, cluster_file: Path) -> list[str]:
    from toolkit.errors import UserError

    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if program and (program[0] in ("-m", "--module") or program[0].endswith(".py")):
        return program
    if args.config is None:
        raise UserError("--config: dstk train needs the DeepSpeed config (dstk config writes one)")
    if not args.config.is_file():
        raise UserError(f"--config: {args.config} not found")
    extra = ["--config", str(args.config)]
    if "--cluster" not in program:
        extra += ["--cluster", str(cluster_file)]
    return program + extra


def run(args: argparse.Namespace) -> int:
    import yaml

    from toolkit.errors import UserError
    from toolkit.launch import deepspeed_command, hostfile_text

    if args.max_restarts < 0:
        raise UserError("--max-restarts: must not be negative")
    cluster = cluster_from_args(args)
    hostfile, cluster_file = args.run_dir / "hostfile", args.run_dir / "cluster.yaml"
    text = hostfile_text(cluster)
    program = _program(args, cluster_file)
    launch = deepspeed_command(
        cluster, hostfile, program, master_port=args.master_port, include=args.include, exclude=args.exclude
    )
    args.run_dir.mkdir(parents=True, exist_ok=True)
    hostfile.write_text(text)
    cluster_file.write_text(yaml.safe_dump(cluster.model_dump(exclude_none=True), sort_keys=False))
    if args.dry_run:
        print(launch.shell())
        return 0
    import os

    env = {**os.environ, **launch.env}
    argv = [sys.executable, "-m", "deepspeed.launcher.runner", *launch.argv[1:]]
    log = args.run_dir / "launch_events.jsonl"
    attempt = 0
    while True:
        start = time.time()
        code = subprocess.call(argv, env=env)
        _event(log, {"attempt": attempt, "exit_code": code, "seconds": round(time.time() - start, 1)})
        if code == 0 or attempt >= args.max_restarts:
            return code
        attempt += 1
        print(
            f"dstk launch: the job failed (exit {code}); restart {attempt}/{args.max_restarts} from the newest "
            "complete checkpoint",
            file=sys.stderr,
            flush=True,
        )
        if "--resume" not in argv:
            argv += ["--resume", "auto"]


def _event(path: Path, record: dict[str, object]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"time": time.time(), **record}) + "\n")
