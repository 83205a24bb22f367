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

`--ntasks-per-node`: the pdsh backend starts one `deepspeed.launcher.launch` per node (over ssh), which forks
the node's ranks, so SLURM needs one task per node; the MPI and slurm backends start every rank as a task
(`mpirun -n WORLD`, `srun -n WORLD`), so they need one task per GPU.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UserError
from toolkit.launcher.command import ShellVar, Word, launcher_argv, network_env, shell_word
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


def tasks_per_node(cluster: ClusterSpec) -> int:
    """SLURM tasks per node for the cluster's DeepSpeed backend (see the module docstring)."""
    return 1 if cluster.nodes == 1 or cluster.launcher == "pdsh" else cluster.gpus_per_node


def directives(cluster: ClusterSpec, options: SlurmOptions, run_dir: Path) -> list[str]:
    """The #SBATCH lines, validated (UserError naming the flag for anything sbatch cannot carry)."""
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
        f"--ntasks-per-node={tasks_per_node(cluster)}",
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
    lines.append(f"--output={sbatch_path('--run-dir', str(run_dir), 'slurm-%j.out')}")
    return [f"#SBATCH {line}" for line in lines]


def _hostfile_block(cluster: ClusterSpec, hostfile: str) -> list[str]:
    """Bash that turns SLURM_JOB_NODELIST into checked hosts, the hostfile and MASTER_ADDR."""
    q = shlex.quote
    return [
        ': "${SLURM_JOB_NODELIST:?submit this script with sbatch (SLURM_JOB_NODELIST is not set)}"',
        f"host_re={q(BASH_HOSTNAME)}",
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
        f"printf '%s slots={cluster.gpus_per_node}\\n' \"${{hosts[@]}}\" > {q(hostfile)}",
        'export MASTER_ADDR="${hosts[0]}"',
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


def sbatch_script(
    cluster: ClusterSpec,
    program: list[str],
    *,
    run_dir: Path,
    workdir: Path,
    options: SlurmOptions,
    master_port: int = 29500,
    include: str | None = None,
    exclude: str | None = None,
    max_restarts: int = 0,
    env_file: Path | None = None,
    bin_dir: Path | None = None,
) -> str:
    """The sbatch script text. `run_dir` and `workdir` must be absolute (the job may start elsewhere).

    The launcher command is :func:`toolkit.launcher.command.launcher_argv`, exactly as `dstk launch` builds it, with
    the hostfile written at start-up and `--master_addr "${MASTER_ADDR}"`. `max_restarts` > 0 reruns a failed
    launcher with `--resume auto` appended, as `dstk launch --max-restarts` does. `env_file`: the
    `.deepspeed_env` the ranks of a multi-node job get (`DS_ENV_FILE`), as `dstk launch` writes it.
    `bin_dir`: where dstk's `deepspeed` is, put on PATH when the job's environment has none (a virtualenv
    that the submitting shell had not activated).
    """
    if not (run_dir.is_absolute() and workdir.is_absolute()):
        raise ValueError("sbatch_script: run_dir and workdir must be absolute")
    if max_restarts < 0:
        raise UserError("--max-restarts: must not be negative")
    hostfile = str(run_dir / "hostfile")
    multi = cluster.nodes > 1
    argv = launcher_argv(
        cluster,
        program,
        hostfile=hostfile if multi else None,
        master_addr=ShellVar("MASTER_ADDR") if multi else None,
        master_port=master_port,
        include=include,
        exclude=exclude,
        cwd=str(workdir),
    )
    env = {"MASTER_PORT": str(master_port), **network_env(cluster)}
    if env_file is not None:
        env["DS_ENV_FILE"] = str(env_file)
    command = command_lines(argv)
    body = [
        "#!/bin/bash",
        *directives(cluster, options, run_dir),
        f"# Written by dstk launch --slurm: {cluster.nodes} x {cluster.gpus_per_node} ranks on "
        f"{re.sub(r'[^A-Za-z0-9._+-]', '?', cluster.name)}.",
        "# Submit with sbatch from the environment dstk runs in (sbatch exports it to the job).",
        "set -euo pipefail",
        f"cd -- {shlex.quote(str(workdir))}",
        *(
            [f'command -v deepspeed > /dev/null || export PATH={shlex.quote(str(bin_dir))}:"$PATH"']
            if bin_dir is not None
            else []
        ),
        *_hostfile_block(cluster, hostfile),
        *[f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())],
    ]
    if max_restarts == 0:
        body.append(command)
    else:
        retry = argv if "--resume" in program else [*argv, "--resume", "auto"]
        body += [
            "status=0",
            f"{command} || status=$?",
            "attempt=0",
            f"while (( status != 0 && attempt < {max_restarts} )); do",
            "  attempt=$((attempt + 1))",
            f'  echo "dstk: the job failed (exit $status); restart $attempt/{max_restarts} from the newest '
            'complete checkpoint" >&2',
            "  status=0",
            f"  {command_lines(retry, indent='    ')} || status=$?",
            "done",
            'exit "$status"',
        ]
    return "\n".join(body) + "\n"
