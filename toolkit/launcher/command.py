"""Hostfiles and `deepspeed` launcher commands, built as argument lists (pure; no processes started here).

Everything that reaches a shell or a remote host is validated: hostnames and interface names must be plain
DNS/identifier strings, so a hostile value (spaces, `;`, `$()`) is refused rather than quoted into a command
that pdsh or ssh would interpret again on the far side.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UserError
from toolkit.plan.specs import ClusterSpec

HOSTNAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})$")
IDENTIFIER = re.compile(r"^[A-Za-z0-9_.:-]+$")


def check_hostname(name: str, field: str = "hostnames") -> str:
    if not HOSTNAME.match(name):
        raise UserError(f"{field}: {name!r} is not a valid hostname (letters, digits, '.', '-', '_' only)")
    return name


def hosts(cluster: ClusterSpec) -> list[str]:
    names = cluster.hostnames or (["localhost"] if cluster.nodes == 1 else None)
    if names is None:
        raise UserError(
            f"hostnames: cluster {cluster.name} has {cluster.nodes} nodes; list their hostnames in the cluster file"
        )
    return [check_hostname(h) for h in names]


def hostfile_text(cluster: ClusterSpec) -> str:
    """MPI-style hostfile: one `host slots=N` line per node."""
    return "".join(f"{h} slots={cluster.gpus_per_node}\n" for h in hosts(cluster))


def parse_hostfile(text: str) -> list[tuple[str, int]]:
    """(host, slots) per line, as DeepSpeed's runner reads it; comments and blank lines ignored."""
    out: list[tuple[str, int]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(\S+)\s+slots=(\d+)", line)
        if not m:
            raise UserError(f"hostfile line {lineno}: {raw.strip()!r} is not 'HOST slots=N'")
        host, slots = check_hostname(m.group(1), f"hostfile line {lineno}"), int(m.group(2))
        if slots <= 0:
            raise UserError(f"hostfile line {lineno}: slots must be positive")
        if any(h == host for h, _ in out):
            raise UserError(f"hostfile line {lineno}: host {host} is listed twice")
        out.append((host, slots))
    if not out:
        raise UserError("hostfile: no hosts")
    return out


@dataclass(frozen=True)
class ShellVar:
    """A launcher word whose value is only known when the job runs (e.g. the SLURM job's first host).

    Rendered as a double-quoted expansion, `"${NAME}"`, so whatever the variable holds stays one word.
    """

    name: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            raise ValueError(f"ShellVar: {self.name!r} is not a shell variable name")


Word = str | ShellVar


def shell_word(word: Word) -> str:
    """One argv word as shell source: `shlex.quote` for literals, `"${NAME}"` for run-time variables."""
    return f'"${{{word.name}}}"' if isinstance(word, ShellVar) else shlex.quote(word)


@dataclass(frozen=True)
class Launch:
    """A `deepspeed` launcher invocation and the environment it needs."""

    argv: list[Word]
    env: dict[str, str]

    def shell(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (prefix + " " if prefix else "") + " ".join(shell_word(a) for a in self.argv)


def network_env(cluster: ClusterSpec) -> dict[str, str]:
    env: dict[str, str] = {}
    if cluster.network_interface:
        if not IDENTIFIER.match(cluster.network_interface):
            raise UserError(f"network_interface: {cluster.network_interface!r} is not an interface name")
        env.update(NCCL_SOCKET_IFNAME=cluster.network_interface, GLOO_SOCKET_IFNAME=cluster.network_interface)
    return env


FORWARDED = (
    "DSTK_",
    "HF_",
    "TRANSFORMERS_",
    "WANDB_",
    "TORCH_EXTENSIONS_DIR",
    "OMP_NUM_THREADS",
    "PATH",
    "VIRTUAL_ENV",
    "TOKENIZERS_PARALLELISM",
)
"""Launcher variables (names, or prefixes ending in `_`) every rank of a multi-node job gets as well: DeepSpeed's
runner forwards only PYTHON*, MLFLOW*, MV2*, UCX* and the accelerator's own (NCCL* on CUDA, none on CPU), and
a rank started over ssh sees the node's login environment. Without these a remote rank finds another `PATH`
(no `ninja` for DeepSpeed's JIT ops), another op cache (`TORCH_EXTENSIONS_DIR`: a minute of rebuilding), and
goes online where the launcher was offline (`HF_HUB_OFFLINE`)."""

ENV_VALUE = re.compile(r"[^\"$`\\\n\r,]*")
"""What an `.deepspeed_env` value may hold. The pdsh backend sends `export KEY=VALUE;` to a remote shell, in double
quotes where the value has a space or other special character (`MultiNodeRunner.add_export`), so `"`, `$`,
backquotes and backslashes would be interpreted there; the slurm backend joins the values into one
`srun --export=ALL,K=V,...`, so a comma would split one. A line must be one KEY=VALUE."""


def _env_word(key: str, value: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)) and bool(ENV_VALUE.fullmatch(value))


def rank_env(cluster: ClusterSpec, environ: dict[str, str]) -> dict[str, str]:
    """What every rank of a multi-node job must see, whichever node it starts on: the FORWARDED part of the
    launcher's environment (values a remote shell would re-read are left out), then the network interface, then
    the cluster file's `env` (a bad one is a UserError naming it)."""
    env = {
        k: v
        for k, v in sorted(environ.items())
        if any(k == f or (f.endswith("_") and k.startswith(f)) for f in FORWARDED) and _env_word(k, v)
    }
    env.update(network_env(cluster))
    for key, value in (cluster.env or {}).items():
        if not _env_word(key, value):
            raise UserError(
                f"env.{key}: {value!r} cannot reach the ranks intact (a variable name, and a value without "
                "quotes, $, backquotes, backslashes, commas or newlines: DeepSpeed's launchers pass it through "
                "a remote shell or srun --export)"
            )
        env[key] = value
    return env


def rank_env_file(
    cluster: ClusterSpec, environ: dict[str, str], run_dir: Path, remote: bool = False
) -> tuple[Path, str] | None:
    """Where a multi-node job's `.deepspeed_env` goes (absolute: the runner reads it from DS_ENV_FILE) and its
    text (`rank_env`); None for one local node (`remote`: one node reached over pdsh needs it too). Computed
    before anything is written, so a bad `env` in the cluster file is refused first."""
    if cluster.nodes == 1 and not remote:
        return None
    return (run_dir / "deepspeed_env").resolve(), env_file_text(rank_env(cluster, environ))


def env_file_text(env: dict[str, str]) -> str:
    """`env` as DeepSpeed's `.deepspeed_env` (read by the runner from `DS_ENV_FILE`): one KEY=VALUE per line."""
    return "".join(f"{k}={v}\n" for k, v in env.items())


RANK_SCRIPT = str(Path(__file__).parents[1] / "__main__.py")
"""`dstk` as a script, for the slurm backend: it starts `python SCRIPT ARGS` on every task and ignores
`--module`. The path is this installation's, so the nodes must share it (the usual shared filesystem)."""


MPI_LAUNCHERS = frozenset({"openmpi", "mpich", "impi", "mvapich"})
"""DeepSpeed backends that start every rank through `mpirun`; DeepSpeed 0.19.8 refuses `--num_nodes`,
`--num_gpus`, `--include` and `--exclude` with them (`multinode_runner.py`, `validate_args`): the hostfile's
slots say how many ranks run where."""

REMOTE_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./:=,+@%-]+(?: [A-Za-z0-9_./:=,+@%-]+)*")
"""Words DeepSpeed's pdsh backend can forward intact. It joins the program and its arguments into the command
line of a remote shell, wrapping a word in double quotes only when it contains a space
(`PDSHRunner.parse_user_args`), and puts the working directory there as a bare `cd DIR;`. So `;`, `$()`,
backticks, quotes, globs or newlines in any of them would be interpreted again on every node."""


def check_remote_shell_words(words: list[str], cwd: str) -> None:
    """Refuse what DeepSpeed's pdsh backend would hand to a remote shell unquoted (see REMOTE_SHELL_SAFE)."""
    for word in words:
        if not REMOTE_SHELL_SAFE.fullmatch(word):
            raise UserError(
                f"program: {word!r} would be re-parsed by the remote shell DeepSpeed's pdsh launcher starts on "
                "every node (it does not quote arguments); use letters, digits, spaces and ._/:=,+@%- only, or "
                "launcher openmpi/slurm in the cluster file"
            )
    if not re.fullmatch(r"[A-Za-z0-9_./:=,+@%-]+", cwd):
        raise UserError(
            f"working directory: {cwd!r} reaches every node as a bare `cd` through DeepSpeed's pdsh launcher; "
            "launch from a directory whose path has only letters, digits and ._/:=,+@%-"
        )


def launcher_argv(
    cluster: ClusterSpec,
    program: list[str],
    *,
    hostfile: str | None,
    master_addr: Word | None,
    master_port: int = 29500,
    include: str | None = None,
    exclude: str | None = None,
    cwd: str,
    remote: bool = False,
) -> list[Word]:
    """The `deepspeed` argv for `program` (`["-m", "module", ...]`, `["script.py", ...]`, or dstk train args).

    `hostfile` None means one local node; `remote` reaches even one node through the cluster's backend (an
    elastic job left with one node, which need not be this host). `--no_local_rank`: dstk reads LOCAL_RANK from the environment. On
    the CPU accelerator `--num_gpus` is required: without it the launcher counts NUMA nodes and starts one
    rank. DeepSpeed refuses `--num_nodes/--num_gpus` together with `--include/--exclude` ("Cannot specify
    num_nodes/gpus with include/exclude", runner.py), so a resource filter replaces them.
    """
    if include and exclude:
        raise UserError("--include/--exclude: give one, not both")
    multi = cluster.nodes > 1 or remote
    mpi = multi and cluster.launcher in MPI_LAUNCHERS
    argv: list[Word] = ["deepspeed"]
    if hostfile is not None:
        argv += ["--hostfile", hostfile]
    if (include or exclude) and mpi:
        raise UserError(
            f"--include/--exclude: DeepSpeed's {cluster.launcher} backend does not support worker "
            "include/exclusion; list only the wanted hosts instead"
        )
    slurm = multi and cluster.launcher == "slurm"
    if not (include or exclude or mpi):
        argv += ["--num_nodes", str(cluster.nodes)]
        if not (slurm and cluster.accelerator == "cpu"):  # srun would ask for --gpus-per-node
            argv += ["--num_gpus", str(cluster.gpus_per_node)]
    argv += ["--master_port", str(master_port)]
    if multi:
        if master_addr is None:
            raise UserError("master_addr: a multi-node launch needs the rank-0 host")
        argv += ["--master_addr", master_addr, "--launcher", cluster.launcher]
        if cluster.nodes == 1:  # one remote node: DeepSpeed's runner would start it here, not over ssh
            argv += ["--force_multi"]
        if cluster.ssh_port is not None and cluster.launcher == "pdsh":
            argv += ["--ssh_port", str(cluster.ssh_port)]
        # srun reaches the nodes; the runner's `ssh HOST hostname` check would fail where no sshd is
        if slurm:
            argv += ["--no_ssh_check"]
    for flag, value in (("--include", include), ("--exclude", exclude)):
        if value:
            if not re.fullmatch(r"[A-Za-z0-9._:,@-]+", value):
                raise UserError(f"{flag}: {value!r} is not a NODE[:SLOTS][@NODE...] resource list")
            argv += [flag, value]
    module = bool(program) and program[0] in ("-m", "--module")
    if module:
        if len(program) < 2:
            raise UserError("-m: a module name must follow")
        words = [program[1], *program[2:]]
        argv += ["--no_local_rank", "--module"]
    elif program and program[0].endswith(".py"):
        words = list(program)
    elif slurm:
        words = [RANK_SCRIPT, "train", *program]
    else:
        module, words = True, ["toolkit.cli", "train", *program]
        argv += ["--no_local_rank", "--module"]
    if slurm and module:
        raise UserError(
            "launcher: DeepSpeed's slurm backend runs `python SCRIPT` and ignores --module (multinode_runner.py); "
            "give a .py script, or use launcher pdsh in the cluster file"
        )
    if multi and cluster.launcher == "pdsh":
        check_remote_shell_words(words, cwd)
    return argv + words


def deepspeed_command(
    cluster: ClusterSpec,
    hostfile: Path,
    program: list[str],
    *,
    master_port: int = 29500,
    include: str | None = None,
    exclude: str | None = None,
    cwd: str | None = None,
    remote: bool = False,
) -> Launch:
    """The launcher command for a cluster whose hosts are known now (its `hostnames`, or localhost).

    A single local node gets no `--hostfile`: with one, DeepSpeed's runner treats the job as multi-node and
    insists on ssh to localhost. `cwd` is where the launcher will run (default: here). `env` is what the
    launcher itself needs; the ranks of a multi-node job get `rank_env` through a `.deepspeed_env` file.
    """
    names = hosts(cluster)
    multi = cluster.nodes > 1 or remote
    master = check_hostname(cluster.master_addr or names[0], "master_addr") if multi else None
    argv = launcher_argv(
        cluster,
        program,
        hostfile=None if names == ["localhost"] else str(hostfile),
        master_addr=master,
        master_port=master_port,
        include=include,
        exclude=exclude,
        cwd=cwd if cwd is not None else os.getcwd(),
        remote=remote,
    )
    return Launch(argv=argv, env=network_env(cluster))
