"""Hostfiles and `deepspeed` launcher commands, built as argument lists (pure; no processes started here).

Everything that reaches a shell or a remote host is validated: hostnames and interface names must be plain
DNS/identifier strings, so a hostile value (spaces, `;`, `$()`) is refused rather than quoted into a command
that pdsh or ssh would interpret again on the far side.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UserError
from toolkit.specs import ClusterSpec

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
class Launch:
    """A `deepspeed` launcher invocation and the environment it needs."""

    argv: list[str]
    env: dict[str, str]

    def shell(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (prefix + " " if prefix else "") + " ".join(shlex.quote(a) for a in self.argv)


def network_env(cluster: ClusterSpec) -> dict[str, str]:
    env: dict[str, str] = {}
    if cluster.network_interface:
        if not IDENTIFIER.match(cluster.network_interface):
            raise UserError(f"network_interface: {cluster.network_interface!r} is not an interface name")
        env.update(NCCL_SOCKET_IFNAME=cluster.network_interface, GLOO_SOCKET_IFNAME=cluster.network_interface)
    return env


def deepspeed_command(
    cluster: ClusterSpec,
    hostfile: Path,
    program: list[str],
    *,
    master_port: int = 29500,
    include: str | None = None,
    exclude: str | None = None,
) -> Launch:
    """The launcher command for `program` (`["-m", "module", ...]`, `["script.py", ...]`, or dstk train args).

    `--no_local_rank`: dstk reads LOCAL_RANK from the environment. On the CPU accelerator `--num_gpus` is
    required: without it the launcher counts NUMA nodes and starts one rank. A single local node gets no
    `--hostfile`: with one, DeepSpeed's runner treats the job as multi-node and insists on ssh to localhost.
    """
    if include and exclude:
        raise UserError("--include/--exclude: give one, not both")
    argv = ["deepspeed"]
    if hosts(cluster) != ["localhost"]:
        argv += ["--hostfile", str(hostfile)]
    argv += ["--num_nodes", str(cluster.nodes), "--num_gpus", str(cluster.gpus_per_node)]
    argv += ["--master_port", str(master_port)]
    if cluster.nodes > 1:
        master = check_hostname(cluster.master_addr or hosts(cluster)[0], "master_addr")
        argv += ["--master_addr", master, "--launcher", cluster.launcher]
    for flag, value in (("--include", include), ("--exclude", exclude)):
        if value:
            if not re.fullmatch(r"[A-Za-z0-9._:,@-]+", value):
                raise UserError(f"{flag}: {value!r} is not a NODE[:SLOTS][@NODE...] resource list")
            argv += [flag, value]
    if program and program[0] in ("-m", "--module"):
        if len(program) < 2:
            raise UserError("-m: a module name must follow")
        argv += ["--no_local_rank", "--module", program[1], *program[2:]]
    elif program and program[0].endswith(".py"):
        argv += [program[0], *program[1:]]
    else:
        argv += ["--no_local_rank", "--module", "toolkit.cli", "train", *program]
    return Launch(argv=argv, env=network_env(cluster))
