"""`dstk launch`: hostfiles and launcher commands as argument lists, hostile input refused (no processes)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from tests.cli import REPO, dstk
from toolkit.errors import UserError
from toolkit.launcher.command import deepspeed_command, hostfile_text, parse_hostfile
from toolkit.plan.load import load_cluster


def _cluster_file(tmp_path, hostnames, **extra):
    import yaml

    data = {
        "nodes": len(hostnames),
        "gpus_per_node": 8,
        "gpu_memory_gib": 80,
        "gpu_peak_tflops": 312,
        "intra_node_gb_per_s": 232,
        "inter_node_gb_per_s": 24,
        "cpu_memory_gib": 1000,
        "hostnames": hostnames,
        **extra,
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_single_node_dry_run_is_the_deepspeed_command(tmp_path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')  # dstk launch validates it
    r = dstk(
        "launch",
        "--cluster",
        "cpu",
        "--config",
        str(cfg),
        "--run-dir",
        str(tmp_path),
        "--dry-run",
        "--",
        "--model",
        "tiny-gpt2",
        "--steps",
        "5",
    )
    assert r.code == 0, r.err
    argv = shlex.split(r.out)
    assert argv[:7] == ["deepspeed", "--num_nodes", "1", "--num_gpus", "2", "--master_port", "29500"]
    assert "--hostfile" not in argv  # one local node: DeepSpeed would otherwise insist on ssh to localhost
    assert argv[argv.index("--module") + 1 : argv.index("--module") + 3] == ["toolkit.cli", "train"]
    assert argv[-4:] == ["--config", str(cfg), "--cluster", str(tmp_path / "cluster.yaml")]
    assert (tmp_path / "hostfile").read_text() == "localhost slots=2\n"


def test_multi_node_command_hostfile_and_network(tmp_path) -> None:
    cluster = load_cluster(str(_cluster_file(tmp_path, ["worker-0", "worker-1"], network_interface="ib0")))
    assert hostfile_text(cluster) == "worker-0 slots=8\nworker-1 slots=8\n"
    launch = deepspeed_command(
        cluster, tmp_path / "hostfile", ["train.py", "--lr", "1e-4"], master_port=29600
    )
    assert launch.argv[:3] == ["deepspeed", "--hostfile", str(tmp_path / "hostfile")]
    assert launch.argv[9:13] == ["--master_addr", "worker-0", "--launcher", "pdsh"]
    assert launch.argv[-3:] == ["train.py", "--lr", "1e-4"]
    assert launch.env == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0"}
    module = deepspeed_command(cluster, tmp_path / "h", ["-m", "my.train", "--x"])
    assert module.argv[-4:] == ["--no_local_rank", "--module", "my.train", "--x"]


@pytest.mark.parametrize("host", ["node one", "node;rm -rf /", "$(reboot)", "a`b`", "-oProxyCommand=x", ""])
def test_hostile_hostnames_are_refused(tmp_path, host) -> None:
    path = _cluster_file(tmp_path, ["ok-node", host])
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')  # dstk launch validates it
    r = dstk(
        "launch", "--cluster", str(path), "--config", str(cfg), "--run-dir", str(tmp_path / "r"), "--dry-run"
    )
    assert r.code == 2 and r.err.count("\n") == 1 and "hostname" in r.err
    assert not (tmp_path / "r" / "hostfile").exists()  # nothing written for a refused launch


def test_hostile_interface_and_resource_lists(tmp_path) -> None:
    cluster = load_cluster(str(_cluster_file(tmp_path, ["a", "b"], network_interface="ib0; reboot")))
    with pytest.raises(UserError, match="network_interface"):
        deepspeed_command(cluster, tmp_path / "h", [])
    ok = load_cluster(str(_cluster_file(tmp_path, ["a", "b"])))
    with pytest.raises(UserError, match="--include"):
        deepspeed_command(ok, tmp_path / "h", [], include="a; reboot")


def test_parse_hostfile() -> None:
    assert parse_hostfile("# pool\nworker-0 slots=8\n\nworker-1 slots=4  # small\n") == [
        ("worker-0", 8),
        ("worker-1", 4),
    ]
    for bad, match in (
        ("worker-0\n", "is not 'HOST slots=N'"),
        ("w slots=0\n", "slots must be positive"),
        ("w slots=2\nw slots=2\n", "listed twice"),
        ("", "no hosts"),
        ("x;y slots=1\n", "hostname"),
    ):
        with pytest.raises(UserError, match=match):
            parse_hostfile(bad)


def test_launch_needs_config_for_dstk_train(tmp_path) -> None:
    r = dstk("launch", "--cluster", "cpu", "--run-dir", str(tmp_path), "--dry-run", "--", "--model", "gpt2")
    assert r.code == 2 and "--config" in r.err
    r = dstk("launch", "--cluster", "cpu", "--config", str(tmp_path / "missing.json"), "--dry-run")
    assert r.code == 2 and "not found" in r.err


def test_shell_wrapper_parses() -> None:
    subprocess.run(["bash", "-n", str(REPO / "launch" / "train.sh")], check=True)


def test_stale_jit_build_locks_are_reported_not_fresh_ones(tmp_path) -> None:
    """A killed JIT build leaves `<op>/lock`; later jobs wait on it for ever. Only old locks are reported."""
    import os
    import time

    from toolkit.launcher.job import stale_build_locks

    old = tmp_path / "cpu_adam" / "lock"
    fresh = tmp_path / "py311_cpu" / "shm_comm" / "lock"
    for path in (old, fresh):
        path.parent.mkdir(parents=True)
        path.touch()
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    assert stale_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)}) == [old]
    assert stale_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)}, min_age_s=0) == sorted([old, fresh])
