"""`dstk launch --slurm FILE`: an sbatch script that runs the same `deepspeed` command as `dstk launch` (pure).

SLURM decides the hosts, so the script builds the hostfile when the job starts, from `scontrol show hostnames
"$SLURM_JOB_NODELIST"`, and takes MASTER_ADDR from the first host. Three layers interpret what we write, and
each gets its own protection:

- `#SBATCH` lines are read by sbatch's own tokenizer (`_get_argument` in `src/sbatch/opt.c`): quotes group
  characters, a backslash escapes, an unquoted `#` ends the line, and a line holding `packjob`/`hetjob`
  anywhere, even inside a value, is taken as a heterogeneous-job separator (`_hetjob_check`). Names are limited to plain characters; the output path is double-quoted, and what
  cannot be carried there (quotes, backslashes, control characters, those two words) is refused.
- The script body is bash: every literal is `shlex.quote`d; the one run-time value, the master host, is a
  double-quoted `"${MASTER_ADDR}"`; host names coming out of `scontrol` are checked against the same
  pattern as cluster-file hostnames before they reach the hostfile.
- DeepSpeed's pdsh backend re-parses the program and its arguments in a remote shell:
  :func:`toolkit.launcher.command.check_remote_shell_words` refuses what it would mangle.

The ranks are SLURM tasks, one per GPU, started by `srun` inside the allocation, whatever launcher the cluster
file names for interactive launches: ranks started over pdsh/ssh from the batch script would run outside the
job step (no cgroup, no accounting, not reached by `scancel`, and ssh between compute nodes needed).

A job longer than its time limit stops itself cleanly: `#SBATCH --signal=B:USR1@LEAD` has SLURM warn the batch
shell LEAD seconds before the limit (up to 30 s earlier: its time checks run every 30 s); the shell passes the
signal to every rank (`scancel --signal=USR1` on the job's steps: srun dies of a USR1 that comes before its
step is set up); the ranks agree on a step, save a checkpoint there and exit 138 (128 + SIGUSR1), and the
shell requeues the job (`scontrol requeue`, `#SBATCH --requeue`), which starts the
script again, under the same job id, with `SLURM_RESTART_COUNT` set: it then resumes from the newest complete
checkpoint. A job that ends otherwise is not requeued.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UserError
from toolkit.launcher.command import Word, network_env, shell_word
from toolkit.plan.specs import ClusterSpec

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
BASH_HOSTNAME = f"^[{_ALNUM}][{_ALNUM}._-]{{0,252}}$"
"""`toolkit.launcher.command.HOSTNAME` as a bash ERE. Letters are listed, not ranged: bash matches `[A-Z]` by the
locale's collation, which admits accented letters in some UTF-8 locales. A test checks both patterns agree."""

NAME = re.compile(r"[A-Za-z0-9._+-]{1,128}")
"""Job names: what every SLURM version and every file-name pattern (`%x`) takes without quoting."""
SLURM_TIME = re.compile(r"\d+(?::\d{1,2}){0,2}|\d+-\d{1,2}(?::\d{1,2}){0,2}")
"""sbatch --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
SLURM_LIST = re.compile(r"[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*")
"""Partition and account names (comma-separated lists allowed for partitions)."""
GRES = re.compile(r"[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)*(?:,[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)*)*")
"""Generic resources, e.g. gpu:8 or gpu:a100:8."""
SBATCH_SEPARATORS = ("packjob", "hetjob")
"""Words that make sbatch read an #SBATCH line as a heterogeneous-job separator, wherever they appear."""


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    """The #SBATCH settings dstk does not derive from the cluster."""

    job_name: str = "dstk"
    """--job-name; letters, digits and ._+- only."""
    time: str | None = None
    """--time wall-clock limit (e.g. 2-00:00:00); none: the partition's default."""
    partition: str | None = None
    """--partition."""
    account: str | None = None
    """--account to charge."""
    cpus_per_task: int | None = None
    """--cpus-per-task; none: `--exclusive` whole nodes (one launcher task starts every rank of its node)."""
    gres: str | None = None
    """--gres instead of --gpus-per-node (older SLURM, or a GPU type), e.g. gpu:a100:8."""


STOP_MARGIN_S = 30
"""Seconds the lead keeps beyond the step and the save: the ranks' exit, `scontrol requeue`, and a save slower
than planned. SLURM itself may signal up to a minute early, never late."""


def signal_lead_s(step_s: float, save_s: float) -> int:
    """How long before the time limit SLURM warns the job (`--signal=B:USR1@LEAD`): the rank that gets the
    warning finishes its step, the next step carries the stop to every rank, then the checkpoint is written —
    two steps and a save, plus STOP_MARGIN_S; sbatch takes at most 65535."""
    return min(65535, math.ceil(2 * step_s + 1.5 * save_s) + STOP_MARGIN_S)


def slurm_seconds(text: str) -> int:
    """`--time` in seconds: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S, as sbatch reads it."""
    if not SLURM_TIME.fullmatch(text):
        raise UserError(f"--time: {text!r} cannot go into an #SBATCH line; use M, H:M:S or D-H:M:S")
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", text
    parts = [int(x) for x in rest.split(":")]
    if dash:  # D-H, D-H:M, D-H:M:S
        h, m, sec = [*parts, 0, 0][:3]
    elif len(parts) == 1:  # M
        h, m, sec = 0, parts[0], 0
    elif len(parts) == 2:  # M:S
        h, m, sec = 0, parts[0], parts[1]
    else:
        h, m, sec = parts
    return int(days) * 86400 + h * 3600 + m * 60 + sec


def _plain(flag: str, value: str | None, pattern: re.Pattern[str], what: str) -> str | None:
    if value is None:
        return None
    if not pattern.fullmatch(value) or any(w in value.lower() for w in SBATCH_SEPARATORS):
        raise UserError(f"{flag}: {value!r} cannot go into an #SBATCH line; {what}")
    return value


def sbatch_path(flag: str, directory: str, pattern: str) -> str:
    """`directory/pattern` as one double-quoted sbatch word, or a UserError naming `flag`.

    Inside double quotes sbatch keeps spaces, `#`, `;`, `$()` and backticks literally (no shell reads
    #SBATCH lines). `%` starts a file-name pattern (`%j` = job id), so a literal one in `directory` is doubled.
    """
    bad = [c for c in directory if c in "\"'\\" or ord(c) < 32 or ord(c) == 127]
    if bad:
        raise UserError(
            f"{flag}: {directory!r} cannot go into an #SBATCH line (it holds {bad[0]!r}: quotes, backslashes and "
            "control characters such as newlines cannot be carried there); choose another directory"
        )
    if any(w in directory.lower() for w in SBATCH_SEPARATORS):
        raise UserError(
            f"{flag}: {directory!r} holds packjob/hetjob, which sbatch reads as a heterogeneous-job separator"
        )
    return '"' + directory.replace("%", "%%").rstrip("/") + "/" + pattern + '"'


RANK_ENV = 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"'
"""What each srun task runs before the program: torch.distributed's variables from SLURM's (a fixed string; the
program and its arguments follow as positional parameters, so nothing in them is re-parsed by a shell)."""
IGNORE_USR1 = "trap '' USR1; "
"""Before dstk train: SIGUSR1 ignored until the rank listens for it (toolkit.run.stop.StopRequest.listen_early),
instead of ending a rank that is still starting (the default action). The ignored disposition survives exec."""
STOPPED = 138
"""How a rank exits when SIGUSR1 stopped it at a checkpoint (128 + 10), and so srun."""


def directives(
    cluster: ClusterSpec, options: SlurmOptions, run_dir: Path, lead_s: int | None = None
) -> list[str]:
    """The #SBATCH lines, validated (UserError naming the flag for anything sbatch cannot carry). `lead_s`:
    warn the batch shell that long before the time limit, requeue, and append to the output file."""
    name = _plain("--job-name", options.job_name, NAME, "use letters, digits and ._+- (at most 128)")
    time = _plain("--time", options.time, SLURM_TIME, "use M, H:M:S or D-H:M:S")
    partition = _plain(
        "--partition", options.partition, SLURM_LIST, "use letters, digits and ._- (comma lists)"
    )
    account = _plain("--account", options.account, SLURM_LIST, "use letters, digits and ._-")
    gres = _plain("--gres", options.gres, GRES, "use NAME[:TYPE]:COUNT, e.g. gpu:a100:8")
    if options.cpus_per_task is not None and options.cpus_per_task < 1:
        raise UserError(f"--cpus-per-task: {options.cpus_per_task} must be at least 1")
    lines = [
        f"--job-name={name}",
        f"--nodes={cluster.nodes}",
        f"--ntasks-per-node={cluster.gpus_per_node}",
    ]
    if gres:
        lines.append(f"--gres={gres}")
    elif cluster.accelerator != "cpu":
        lines.append(f"--gpus-per-node={cluster.gpus_per_node}")
    if options.cpus_per_task is not None:
        lines.append(f"--cpus-per-task={options.cpus_per_task}")
    else:
        lines += ["--exclusive", "--mem=0"]
    if time:
        lines.append(f"--time={time}")
    if partition:
        lines.append(f"--partition={partition}")
    if account:
        lines.append(f"--account={account}")
    if lead_s is not None:  # a requeued job appends to its output instead of starting it over
        lines += [f"--signal=B:USR1@{lead_s}", "--requeue", "--open-mode=append"]
    lines.append(f"--output={sbatch_path('--run-dir', str(run_dir), 'slurm-%j.out')}")
    return [f"#SBATCH {line}" for line in lines]


def _hosts_block(cluster: ClusterSpec) -> list[str]:
    """Bash that checks SLURM_JOB_NODELIST's hosts and takes MASTER_ADDR from the first."""
    return [
        ': "${SLURM_JOB_NODELIST:?submit this script with sbatch (SLURM_JOB_NODELIST is not set)}"',
        f"host_re={shlex.quote(BASH_HOSTNAME)}",
        'hostlist=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "hosts=()",
        "while IFS= read -r host; do",
        '  [[ -z "$host" ]] && continue',
        '  if [[ ! "$host" =~ $host_re ]]; then',
        "    printf 'dstk: refusing host name %q from SLURM_JOB_NODELIST (letters, digits, ., -, _ only)\\n' "
        '"$host" >&2',
        "    exit 1",
        "  fi",
        '  hosts+=("$host")',
        'done <<< "$hostlist"',
        f"if (( ${{#hosts[@]}} != {cluster.nodes} )); then",
        f'  echo "dstk: the plan is for {cluster.nodes} node(s); SLURM allocated ${{#hosts[@]}}" >&2',
        "  exit 1",
        "fi",
        'export MASTER_ADDR="${hosts[0]}"',
    ]


_RANKS = [
    "# SLURM's warning before the time limit reaches this shell only (B:). It is passed to the ranks with scancel",
    "# (srun itself dies of a USR1 that comes before it has set up its step), again every 10 s until they end:",
    "# a rank ignores it until it can take it, then saves a checkpoint at the next step boundary and exits",
    "stop=0",
    "on_usr1() { stop=1; }",
    "trap on_usr1 USR1",
    "run_ranks() {  # srun in the background, so that the trap runs while the shell waits for it",
    '  "$@" &',
    "  local step=$! status=0 sent=-10",
    '  while kill -0 "$step" 2> /dev/null; do',
    "    if (( stop && SECONDS - sent >= 10 )); then",
    '      scancel --signal=USR1 "$SLURM_JOB_ID" || true',
    "      sent=$SECONDS",
    "    fi",
    "    sleep 1",
    "  done",
    '  wait "$step" || status=$?',
    '  return "$status"',
    "}",
]


def command_lines(argv: list[Word], indent: str = "  ", width: int = 100) -> str:
    """The quoted command, continued over lines with `\\` between words (never inside a quoted word)."""
    lines, line = [], ""
    for word in (shell_word(w) for w in argv):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return f" \\\n{indent}".join(lines)


def srun_argv(cluster: ClusterSpec, program: list[str], python: str, usr1: bool = False) -> list[Word]:
    """One srun task per rank, each running `program` (dstk train's arguments, a `.py` script and its arguments,
    or `-m MODULE ...`) with the torch.distributed variables set from SLURM's (RANK_ENV)."""
    if program and program[0] in ("-m", "--module"):
        if len(program) < 2:
            raise UserError("-m: a module name must follow")
        words = [python, "-m", *program[1:]]
    elif program and program[0].endswith(".py"):
        words = [python, *program]
    else:
        words = [python, "-m", "toolkit.cli", "train", *program]
    tasks = [f"--nodes={cluster.nodes}", f"--ntasks-per-node={cluster.gpus_per_node}", "--kill-on-bad-exit=1"]
    return ["srun", *tasks, "bash", "-c", (IGNORE_USR1 if usr1 else "") + RANK_ENV, "dstk-rank", *words]


def sbatch_script(
    cluster: ClusterSpec,
    program: list[str],
    *,
    run_dir: Path,
    workdir: Path,
    options: SlurmOptions,
    python: str,
    master_port: int = 29500,
    max_restarts: int = 0,
    lead_s: int | None = None,
    resume: list[str] | None = None,
) -> str:
    """The sbatch script text. `run_dir` and `workdir` must be absolute (the job may start elsewhere).

    The ranks are `srun_argv(program)`. `resume`: the program that continues from the newest checkpoint, run
    after a failure (up to `max_restarts` times) and when the job was requeued (default: `program` with
    `--resume auto`). `lead_s`: checkpoint and requeue that long before the time limit (module docstring).
    """
    if not (run_dir.is_absolute() and workdir.is_absolute()):
        raise ValueError("sbatch_script: run_dir and workdir must be absolute")
    if max_restarts < 0:
        raise UserError("--max-restarts: must not be negative")
    if resume is None:
        resume = program if "--resume" in program else [*program, "--resume", "auto"]
    usr1 = lead_s is not None
    first = command_lines(srun_argv(cluster, program, python, usr1), indent="    ")
    again = command_lines(srun_argv(cluster, resume, python, usr1), indent="    ")
    env = {"MASTER_PORT": str(master_port), **network_env(cluster), **_cluster_env(cluster)}
    body = [
        "#!/bin/bash",
        *directives(cluster, options, run_dir, lead_s),
        f"# Written by dstk launch --slurm: {cluster.nodes} x {cluster.gpus_per_node} ranks on "
        f"{re.sub(r'[^A-Za-z0-9._+-]', '?', cluster.name)}, one srun task each.",
        "# Submit with sbatch from the environment dstk runs in (sbatch exports it to the job).",
        "set -euo pipefail",
        f"cd -- {shlex.quote(str(workdir))}",
        *_hosts_block(cluster),
        *[f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())],
        *(
            ['export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"']
            if cluster.accelerator == "cpu"
            else []
        ),
        *(_RANKS if lead_s is not None else ['run_ranks() { "$@"; }']),
        "status=0",
        "if (( ${SLURM_RESTART_COUNT:-0} > 0 )); then",
        '  echo "dstk: job $SLURM_JOB_ID requeued (restart $SLURM_RESTART_COUNT): resuming from the newest complete '
        'checkpoint" >&2',
        f"  run_ranks {again} || status=$?",
        "else",
        f"  run_ranks {first} || status=$?",
        "fi",
        "attempt=0",
        f"while (( status != 0 && status != {STOPPED} && attempt < {max_restarts} )); do",
        "  attempt=$((attempt + 1))",
        f'  echo "dstk: the job failed (exit $status); restart $attempt/{max_restarts} from the newest complete '
        'checkpoint" >&2',
        "  status=0",
        f"  run_ranks {again} || status=$?",
        "done",
    ]
    if lead_s is not None:
        body += [
            f"if (( stop && status == {STOPPED} )); then",
            '  echo "dstk: the time limit is near and the ranks saved a checkpoint: requeueing job $SLURM_JOB_ID, which '
            'resumes there" >&2',
            '  scontrol requeue "$SLURM_JOB_ID"',
            "  exit 0",
            "fi",
        ]
    body.append('exit "$status"')
    return "\n".join(body) + "\n"


def _cluster_env(cluster: ClusterSpec) -> dict[str, str]:
    """The cluster file's `env`, checked as for every launch (toolkit.launcher.command.rank_env)."""
    from toolkit.launcher.command import rank_env

    given = cluster.env or {}
    return {k: v for k, v in rank_env(cluster, {}).items() if k in given}
