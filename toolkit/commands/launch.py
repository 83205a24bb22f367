"""`dstk launch`: write the hostfile, build the `deepspeed` launcher command, run it (or print it).

With no script after `--`, the program is `dstk train` with the given config; `--max-restarts N` reruns a
failed job up to N times, resuming from the newest complete checkpoint each time. `--slurm FILE` writes an
sbatch script that runs the same command on the nodes SLURM allocates, instead of running anything.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from toolkit.commands import add_cluster_args, cluster_from_args
from toolkit.launcher.heartbeat import HANG_FLOOR_S, HANG_STEPS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_args(parser, required=False)
    parser.add_argument("--config", type=Path, metavar="FILE", help="DeepSpeed JSON for dstk train")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path("runs/launch"),
        metavar="DIR",
        help="where the hostfile, the resolved cluster and the launch log go",
    )
    parser.add_argument(
        "--master-port",
        type=int,
        default=None,
        metavar="P",
        help="rendezvous port (default 29500; on one node a free one when 29500 is taken)",
    )
    parser.add_argument("--include", metavar="NODES", help="deepspeed --include resource list")
    parser.add_argument("--exclude", metavar="NODES", help="deepspeed --exclude resource list")
    _add_fault_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    _add_slurm_arguments(parser)
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        help="after --: SCRIPT ARGS, -m MODULE ARGS, or dstk train ARGS (the default)",
    )
    # a dstk train flag before `--` is misplaced, not misspelt; a launch flag after it, the other way round
    parser.other_side = (
        _train_flags,
        "a dstk train flag: put it after -- (dstk launch [launch flags] -- [train flags])",
    )
    parser.set_defaults(_launch_flags=tuple(f for a in parser._actions for f in a.option_strings))


def _train_flags() -> list[str]:
    from toolkit.run.launching import train_parser

    return [f for a in train_parser()._actions for f in a.option_strings]


def _add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    """What the launch does when the job fails, hangs or loses a node (docs/fault-tolerance.md)."""
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="rerun a failed job up to N times, resuming from the newest complete checkpoint",
    )
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=None,
        metavar="S",
        help="stop the job when no rank advances for S seconds (each rank's heartbeat under the train run "
        "dir), naming the rank and node that stopped; with --max-restarts it restarts (default: "
        f"{HANG_STEPS} predicted steps, at least {HANG_FLOOR_S:g} s; 0: off)",
    )
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="several nodes over pdsh: when a node no longer answers ssh, go on with the nodes that remain "
        "(same global batch, the newest checkpoint converted to universal) instead of stopping",
    )


def _add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    slurm = parser.add_argument_group("SLURM (with --slurm)")
    slurm.add_argument(
        "--slurm",
        type=Path,
        metavar="FILE",
        help="write an sbatch script for this launch to FILE (hostfile from SLURM_JOB_NODELIST) and stop",
    )
    slurm.add_argument("--job-name", metavar="NAME", help="#SBATCH --job-name (default dstk-MODEL)")
    slurm.add_argument("--time", metavar="D-H:M:S", help="#SBATCH --time wall-clock limit")
    slurm.add_argument("--partition", metavar="P", help="#SBATCH --partition")
    slurm.add_argument("--account", metavar="A", help="#SBATCH --account")
    slurm.add_argument(
        "--cpus-per-task",
        type=int,
        metavar="N",
        help="#SBATCH --cpus-per-task (default: --exclusive whole nodes)",
    )
    slurm.add_argument(
        "--gres", metavar="SPEC", help="#SBATCH --gres instead of --gpus-per-node, e.g. gpu:a100:8"
    )


def _check(args: argparse.Namespace) -> None:
    """The launch's own flags, before the cluster is read."""
    from toolkit.errors import UserError
    from toolkit.run.launching import SLURM_ONLY

    if args.max_restarts < 0:
        raise UserError("--max-restarts: must not be negative")
    if args.hang_timeout is not None and args.hang_timeout < 0:
        raise UserError("--hang-timeout: must not be negative (0 turns the watch off)")
    if args.slurm is None:
        for flag in SLURM_ONLY:
            if getattr(args, flag.lstrip("-").replace("-", "_")) is not None:
                raise UserError(f"{flag}: only with --slurm FILE")


def run(args: argparse.Namespace) -> int:
    _check(args)
    args.cluster = args.cluster or "local"  # this machine, detected (and calibrated if calibrate ran)
    cluster = cluster_from_args(args)
    if args.slurm is not None:  # a script for SLURM to run: nothing starts here
        from toolkit.run.slurm_job import write_slurm

        return write_slurm(args, cluster)
    from toolkit.run.launching import launch

    return launch(args, cluster)
