"""The run half of `dstk launch`: the train command judged before any rank starts (its flags parsed, the
ranks' pre-flight, DeepSpeed's verdict on the config for the world about to start), the attempts the launch
supervisor runs (hostfile, cluster file, the ranks' environment, the deepspeed launcher argv), the smaller
attempt an --elastic job goes on with, the sbatch script of --slurm, and the last line of a stopped job.
`toolkit/commands/launch.py` parses the flags and calls `launch`."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_PORT = 29500


def rendezvous_port(asked: int | None, probe: bool, token: str = "") -> tuple[int, Any]:
    """The port the job rendezvous on, and its reservation (None where there is nothing to reserve). A busy
    one fails only after every rank started (~30 s, then "address already in use" on rank 0); on one node dstk
    can see that first, and holds the port's lock file until the job ends, so another dstk launch starting
    meanwhile cannot pick the port its ranks have not bound yet (toolkit.launcher.lock.reserve_port). A port
    the user named that is taken is refused in one line; the default is replaced by a free one (said)."""
    from toolkit.launcher.lock import Lock, free_port_reserved, reserve_port

    port = asked or DEFAULT_PORT
    if not probe:
        return port, None
    got = reserve_port(port, token)
    if isinstance(got, Lock):
        return port, got
    if asked is not None:
        from toolkit.errors import UserError

        raise UserError(f"--master-port: {port} is in use on this host ({got}); pick another, or omit it")
    free, lock = free_port_reserved(token)
    print(f"dstk launch: port {port} is taken ({got}); the job rendezvous on {free}", file=sys.stderr)
    return free, lock


def train_parser(launch_flags: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """`dstk train`'s own parser (its flags from commands/train.py), to judge the arguments after `--`; one of
    `launch_flags` found there belongs before `--`."""
    from toolkit.commands import OneLineParser
    from toolkit.run.train_flags import add_train_arguments

    parser = OneLineParser(prog="dstk launch: after --: dstk train")
    add_train_arguments(parser)
    mine = {f for a in parser._actions for f in a.option_strings}
    parser.other_side = (
        lambda: [f for f in launch_flags if f not in mine],
        "a dstk launch flag: put it before -- (dstk launch [launch flags] -- [train flags])",
    )
    return parser


def preflight(
    path: Path, cluster: Any, train_args: list[str], launch_flags: tuple[str, ...] = ()
) -> tuple[Any, list[str]]:
    """Everything the ranks would check (toolkit.run.preflight) and DeepSpeed's verdict on the config for the
    world about to start, before any rank starts or a script is written: a misspelt train flag, data
    prepared for another model, an unwritable checkpoint folder, a resume onto other data, a bad batch fail
    here in seconds with one line, not on every rank after start-up. Returns the checked TrainRun and the
    notes to say once."""
    import os

    from toolkit.errors import UserError
    from toolkit.integrations.ds_input import read_ds_config
    from toolkit.integrations.validate import validate_config
    from toolkit.launcher.lock import TOKEN_ENV
    from toolkit.run.folders import hold, train_folders
    from toolkit.run.preflight import prepare_run

    train = train_parser(launch_flags).parse_args([*train_args, "--config", str(path)])
    # another job in these folders is named first, whatever else is wrong (nothing taken yet)
    hold(train_folders(train.run_dir, train.checkpoint_dir), os.environ.get(TOKEN_ENV, ""), dry_run=True)
    run, notes = prepare_run(train, cluster.world_size, cluster)
    cfg = read_ds_config(path)
    verdict = validate_config(cfg, cluster.world_size, cluster.accelerator)
    if verdict.problems:
        more = (
            f" (and {len(verdict.problems) - 1} more: dstk validate {path} --world-size {cluster.world_size})"
        )
        raise UserError(f"--config: {verdict.problems[0].text}{more if len(verdict.problems) > 1 else ''}")
    return run, notes


def program_of(args: argparse.Namespace, cluster_file: Path, cluster: Any = None) -> tuple[list[str], Any]:
    """The program every rank runs, and `dstk train`'s checked TrainRun (None for a script, or when
    --include/--exclude leave the world size unknown here)."""
    import os

    from toolkit.errors import UserError
    from toolkit.paths import input_file
    from toolkit.run.train_flags import PREFLIGHT_DONE

    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if program and (program[0] in ("-m", "--module") or program[0].endswith(".py")):
        if args.config is not None and cluster is not None:
            _judge_script_config(args.config, cluster, program)
        return program, None
    if args.config is None:
        if "--config" in program:  # a train flag, as dstk train takes it: dstk launch passes it on itself
            raise UserError(
                "--config: give it to dstk launch, before -- (dstk launch --config FILE -- --model ...): launch "
                "checks the config for the world it starts and passes it to every rank"
            )
        raise UserError("--config: dstk train needs the DeepSpeed config (dstk config writes one)")
    input_file(args.config, "--config", "a DeepSpeed JSON config")
    run = None
    if cluster is not None and not (args.include or args.exclude):
        run, notes = preflight(args.config, cluster, program, getattr(args, "_launch_flags", ()))
        for note in notes:
            print(f"dstk launch: note: {note}", file=sys.stderr, flush=True)
        os.environ[PREFLIGHT_DONE] = "1"  # the ranks need not say the notes again
    extra = ["--config", str(args.config)]
    if "--cluster" not in program:
        extra += ["--cluster", str(cluster_file)]
    return program + extra, run


def _judge_script_config(path: Path, cluster: Any, program: list[str]) -> None:
    """--config with a script of the user's own: judged for the world about to start, as dstk train's is. dstk
    launch passes it to dstk train only; a script gets its own arguments, so when they do not name the file
    that is said once (it used to be dropped without a word)."""
    from toolkit.errors import UserError
    from toolkit.integrations.ds_input import read_ds_config
    from toolkit.integrations.validate import validate_config
    from toolkit.paths import input_file

    input_file(path, "--config", "a DeepSpeed JSON config")
    verdict = validate_config(read_ds_config(path), cluster.world_size, cluster.accelerator)
    if verdict.problems:
        raise UserError(f"--config: {verdict.problems[0].text}")
    if not any(str(path) in word for word in program):
        print(
            f"dstk launch: note: --config {path} is checked for this world, but {program[0]} gets only the "
            "arguments after -- (give it the file there, e.g. --deepspeed_config FILE)",
            file=sys.stderr,
            flush=True,
        )


def make_attempt(
    args: argparse.Namespace, cluster: Any, program: list[str], train: Any, remote: bool = False
) -> Any:
    """The launcher command for `cluster` with its files written (hostfile, cluster.yaml, the ranks'
    environment), as one attempt of the supervisor. `remote`: reach even one node over pdsh (an elastic job
    that kept one)."""
    import dataclasses
    import os

    import yaml

    from toolkit.launcher.command import deepspeed_command, hostfile_text, rank_env_file
    from toolkit.launcher.heartbeat import heartbeat_dir
    from toolkit.launcher.supervise import Attempt

    hostfile, cluster_file = args.run_dir / "hostfile", args.run_dir / "cluster.yaml"
    text = hostfile_text(cluster)
    launch = deepspeed_command(
        cluster,
        hostfile,
        program,
        master_port=args.master_port,
        include=args.include,
        exclude=args.exclude,
        remote=remote,
    )
    env = {**os.environ, **launch.env}
    if cluster.accelerator == "cpu" and "OMP_NUM_THREADS" not in env:
        # each rank would otherwise start one OpenMP thread per core: N ranks oversubscribe the cores N times
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cluster.gpus_per_node))
    ranks_env = rank_env_file(cluster, env, args.run_dir, remote)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    hostfile.write_text(text)
    cluster_file.write_text(yaml.safe_dump(cluster.model_dump(exclude_none=True), sort_keys=False))
    if ranks_env is not None:  # what every rank on every node gets (DeepSpeed's runner reads DS_ENV_FILE)
        env_file, env_text = ranks_env
        env_file.write_text(env_text)
        launch = dataclasses.replace(launch, env={**launch.env, "DS_ENV_FILE": str(env_file)})
        env["DS_ENV_FILE"] = str(env_file)
    over_ssh = (cluster.nodes > 1 or remote) and cluster.launcher == "pdsh"
    return Attempt(
        argv=[sys.executable, "-m", "deepspeed.launcher.runner", *launch.argv[1:]],  # type: ignore[list-item]
        env=env,
        program=program,
        cluster=cluster,
        shell=launch.shell(),
        world_size=cluster.world_size,
        hostnames=list(cluster.hostnames) if cluster.hostnames else None,
        heartbeats=heartbeat_dir(train.run_dir) if train is not None else None,
        probe=list(cluster.hostnames or []) if over_ssh else [],
        ssh_port=cluster.ssh_port,
    )


def shrink_to(args: argparse.Namespace, train: Any, attempt: Any, lost: dict[str, str]) -> Any:
    """--elastic: the attempt for the nodes that answer (toolkit.run.elastic), said in one line."""
    from toolkit.launcher.supervise import lost_line
    from toolkit.run.elastic import shrink

    print(f"dstk launch: {lost_line(lost, attempt.ssh_port)}", file=sys.stderr, flush=True)
    if train is None:
        from toolkit.errors import UserError

        raise UserError("--elastic: re-plans dstk train only (not a script, nor with --include/--exclude)")
    program = list(attempt.program)
    config = Path(program[program.index("--config") + 1])
    smaller = shrink(attempt.cluster, list(lost), config, train.model, train.checkpoint_dir, args.run_dir)
    print(f"dstk launch: {smaller.message}", file=sys.stderr, flush=True)
    event(args.run_dir / "launch_events.jsonl", smaller.record)
    program[program.index("--config") + 1] = str(smaller.config)
    if smaller.resume_tag is not None and "--resume" not in program:
        program += ["--resume", "auto"]
    return make_attempt(args, smaller.cluster, program, train, remote=True)


SLURM_ONLY = ("--job-name", "--time", "--partition", "--account", "--cpus-per-task", "--gres")


def say_where_it_stopped(signum: int, program: list[str]) -> None:
    """The last line of a stopped job: which checkpoint it left and the exact command that resumes it."""
    import signal

    from toolkit.run.preflight import resume_manifest

    name = signal.Signals(signum).name
    ckpt = Path(program[program.index("--checkpoint-dir") + 1]) if "--checkpoint-dir" in program else None
    newest = resume_manifest(ckpt, "auto") if ckpt is not None else None  # what `--resume auto` will load
    again = ["dstk", *sys.argv[1:]]
    if "--resume" not in again:
        again += ([] if "--" in again else ["--"]) + ["--resume", "auto"]
    if newest is not None:
        where, step = newest["where"], newest["step"]
        print(
            f"dstk launch: stopped by {name}; the last complete checkpoint is {where} (step {step}); "
            f"resume: {shlex.join(again)}",
            file=sys.stderr,
        )
    else:
        print(
            f"dstk launch: stopped by {name}; no checkpoint was written (give --checkpoint-dir)",
            file=sys.stderr,
        )


def default_job_name(program: list[str]) -> str:
    """dstk-MODEL when the program names a model (sanitised for #SBATCH), else dstk."""
    import re

    if "--model" in program[:-1]:
        model = Path(program[program.index("--model") + 1]).stem
        return ("dstk-" + re.sub(r"[^A-Za-z0-9._+-]", "-", model))[:128]
    return "dstk"


def event(path: Path, record: dict[str, object]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"time": time.time(), **record}) + "\n")


def launch(args: argparse.Namespace, cluster: Any) -> int:
    """`dstk launch` once its flags are read: the train command judged, the files written, then the job run
    by the supervisor (or its command printed with --dry-run; `--slurm` is toolkit.run.slurm_job's)."""
    from toolkit.errors import UserError
    from toolkit.launcher.heartbeat import hang_timeout
    from toolkit.launcher.job import remove_shm_buffers
    from toolkit.launcher.supervise import Supervisor

    if args.elastic and (cluster.nodes == 1 or cluster.launcher != "pdsh"):
        raise UserError(
            "--elastic: for a job on several nodes reached over pdsh/ssh (launcher: pdsh in the cluster file); "
            f"this one has {cluster.nodes} node(s), launcher {cluster.launcher}"
        )
    import uuid

    from toolkit.launcher.lock import TOKEN_ENV
    from toolkit.paths import output_dir

    os.environ[TOKEN_ENV] = uuid.uuid4().hex  # this job's: its ranks find their folders locked under it
    output_dir(args.run_dir, "--run-dir")
    from toolkit.launcher.command import hostfile_text
    from toolkit.launcher.lock import check_folder

    check_folder(args.run_dir, "dstk launch --run-dir")  # another job's, named before anything else is read

    hostfile_text(cluster)  # its host names are checked first, before the train command
    program, train = program_of(args, args.run_dir / "cluster.yaml", cluster)
    # the port first: a taken one is refused before any folder is created
    probe = cluster.nodes == 1 and not args.dry_run
    args.master_port, port = rendezvous_port(args.master_port, probe, os.environ[TOKEN_ENV])
    locks = [port] if port is not None else []
    try:
        locks += _hold_folders(args, train)
        first = make_attempt(args, cluster, program, train)
        if args.dry_run:  # the files the printed command names are written, so it runs as printed
            print(first.shell)
            return 0
        _warn_before_start(first, cluster, train)
        supervisor = Supervisor(
            max_restarts=args.max_restarts,
            hang_timeout_s=hang_timeout(args.hang_timeout, cluster, train),
            events=args.run_dir / "launch_events.jsonl",
            elastic=(lambda a, lost: shrink_to(args, train, a, lost)) if args.elastic else None,
            after=(lambda: remove_shm_buffers(args.master_port)) if cluster.nodes == 1 else (lambda: None),
            stopped=lambda signum: say_where_it_stopped(signum, program),
        )
        return supervisor.run(first)
    finally:
        for lock in locks:
            lock.release()


def _hold_folders(args: argparse.Namespace, train: Any) -> list[Any]:
    """The job's folders (this launch's run folder, dstk train's run and checkpoint folders) locked for the
    whole job, its ranks given the token that says the locks are theirs (toolkit.launcher.lock); a dry run
    only refuses folders another job holds. Stale locks taken over are said."""
    from toolkit.launcher.lock import TOKEN_ENV
    from toolkit.run.folders import hold, train_folders

    folders = [(args.run_dir, "dstk launch --run-dir")]
    if train is not None:
        seen = {args.run_dir.resolve()}
        folders += [
            (f, flag)
            for f, flag in train_folders(train.run_dir, train.checkpoint_dir)
            if f.resolve() not in seen
        ]
    locks, notes = hold(folders, os.environ[TOKEN_ENV], dry_run=args.dry_run)
    for note in notes:
        print(f"dstk launch: note: {note}", file=sys.stderr, flush=True)
    return locks


def _warn_before_start(first: Any, cluster: Any, train: Any) -> None:
    """What would otherwise look like a hang at start-up: a stale JIT build lock, a first op build."""
    from toolkit.launcher.job import stale_build_locks
    from toolkit.run.jit import announcement

    for lock in stale_build_locks(first.env):
        print(
            f"dstk launch: warning: {lock} is a stale JIT build lock (a killed build); ranks that need this op "
            f"will wait for ever: delete {lock.parent} and it is rebuilt",
            file=sys.stderr,
            flush=True,
        )
    said = announcement(cluster.accelerator, train.config if train is not None else None, first.env)
    if said:
        print(f"dstk launch: {said}", file=sys.stderr, flush=True)
