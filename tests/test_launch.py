"""`dstk launch`: hostfiles and launcher commands as argument lists, hostile input refused (no processes)."""

from __future__ import annotations

import shlex
import subprocess
import sys

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


def test_ranks_on_other_nodes_get_the_environment_they_need(tmp_path) -> None:
    """A rank that pdsh/ssh starts sees its node's login environment: dstk forwards what its runs depend on
    (op cache, PATH, offline hubs, threads), the network interface and the cluster file's `env`, through the
    `.deepspeed_env` file DeepSpeed's runner reads; what a remote shell or `srun --export` would re-read is
    left out (forwarded) or refused (the cluster file's, naming the variable)."""
    from toolkit.launcher.command import env_file_text, rank_env

    cluster = load_cluster(
        str(
            _cluster_file(
                tmp_path, ["a", "b"], network_interface="eth1", env={"NCCL_IB_HCA": "mlx5_0", "X": "a b"}
            )
        )
    )
    launcher = {
        "TORCH_EXTENSIONS_DIR": "/w/.venv/torch_extensions",
        "PATH": "/w/.venv/bin:/usr/bin",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "4",
        "DSTK_CACHE_DIR": "/c",
        "HOME": "/root",  # the node's own
        "SSH_AUTH_SOCK": "/tmp/agent",  # the node's own
        "WANDB_API_KEY": "k$(reboot)",  # would run on every node: left out
    }
    env = rank_env(cluster, launcher)
    assert env == {
        "DSTK_CACHE_DIR": "/c",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "4",
        "PATH": "/w/.venv/bin:/usr/bin",
        "TORCH_EXTENSIONS_DIR": "/w/.venv/torch_extensions",
        "NCCL_SOCKET_IFNAME": "eth1",
        "GLOO_SOCKET_IFNAME": "eth1",
        "NCCL_IB_HCA": "mlx5_0",
        "X": "a b",
    }
    assert env_file_text({"A": "1", "B": "x y"}) == "A=1\nB=x y\n"
    for bad in ("$(reboot)", "a,b", 'q"', "a\nb"):
        hostile = load_cluster(str(_cluster_file(tmp_path, ["a", "b"], env={"X": bad})))
        with pytest.raises(UserError, match=r"^env\.X: "):
            rank_env(hostile, {})


def test_multi_node_launch_writes_the_rank_environment_and_passes_the_ssh_port(tmp_path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')  # dstk launch validates it
    path = _cluster_file(tmp_path, ["n1", "n2"], ssh_port=2222, env={"FOO": "bar"})
    run_dir = tmp_path / "r"
    r = dstk(
        *("launch", "--cluster", str(path), "--config", str(cfg), "--run-dir", str(run_dir), "--dry-run"),
        *("--", "--model", "tiny-gpt2", "--steps", "1"),
    )
    assert r.code == 0, r.err
    argv = shlex.split(r.out)
    assert argv[0] == f"DS_ENV_FILE={run_dir.resolve() / 'deepspeed_env'}"
    assert argv[argv.index("--ssh_port") + 1] == "2222"
    assert "FOO=bar\n" in (run_dir / "deepspeed_env").read_text()


def test_slurm_backend_runs_dstk_as_a_script_without_an_ssh_check(tmp_path) -> None:
    """DeepSpeed's slurm backend starts `srun ... python SCRIPT` (no --module) and would first `ssh` to the
    first host; on the CPU accelerator `--num_gpus` would become srun's `--gpus-per-node`."""
    from toolkit.launcher.command import RANK_SCRIPT, launcher_argv

    cluster = load_cluster(str(_cluster_file(tmp_path, ["n1", "n2"], launcher="slurm", accelerator="cpu")))
    argv = launcher_argv(cluster, ["--steps", "3"], hostfile="h", master_addr="n1", cwd="/w")
    assert "--no_ssh_check" in argv and "--num_gpus" not in argv and "--module" not in argv
    assert argv[argv.index(RANK_SCRIPT) :] == [RANK_SCRIPT, "train", "--steps", "3"]
    proc = subprocess.run(
        [sys.executable, RANK_SCRIPT, "train", "--help"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0 and "--checkpoint-dir" in proc.stdout, proc.stderr


def test_a_task_srun_started_takes_its_rank_from_slurm() -> None:
    from toolkit.run.runtime import adopt_slurm_task

    task = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "4"}
    assert adopt_slurm_task(task) and (task["RANK"], task["LOCAL_RANK"], task["WORLD_SIZE"]) == (
        "3",
        "1",
        "4",
    )
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}  # the batch script itself is not a rank
    assert not adopt_slurm_task(batch) and "RANK" not in batch
    launched = {"RANK": "1", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}  # deepspeed's launch set it
    assert not adopt_slurm_task(launched) and launched["RANK"] == "1"


def test_a_rendezvous_port_taken_by_another_program_is_named_as_such(tmp_path) -> None:
    """A rank whose MASTER_PORT another program bound meanwhile (dstk launch reserves its port against other
    dstk launches, not against everything on the host): torch's store cannot listen, and the rank says that
    in one line, not "stopped because another rank failed" with a traceback."""
    import os
    import socket

    cfg = tmp_path / "ds.json"
    cfg.write_text(
        '{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}'
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
        proc = subprocess.run(
            [sys.executable, "-m", "toolkit.cli", "train", "--model", str(REPO / "tests/models/tiny-test-gpt2.yaml"),
             "--config", str(cfg), "--steps", "1", "--run-dir", str(tmp_path / "run")],
            env={**env, "MASTER_PORT": str(port)}, capture_output=True, text=True, cwd=REPO, timeout=300,
        )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dstk train")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (
        lines == [lines[0]] and f"the rendezvous port {port} on 127.0.0.1 is in use (EADDRINUSE)" in lines[0]
    )


def test_a_config_given_with_a_script_of_ones_own_is_judged_and_said_when_the_script_never_sees_it(
    tmp_path,
) -> None:
    """`--config` beside `-- train.py`: checked for the world about to start (refused when DeepSpeed would refuse
    it); dstk launch passes it to dstk train only, so a script whose arguments do not name it is told so once
    (it used to be dropped without a word). Naming it after `--` is what a script does."""
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')
    base = ["launch", "--cluster", "cpu", "--config", str(cfg), "--run-dir", str(tmp_path / "r"), "--dry-run"]
    r = dstk(*base, "--", "train.py", "--lr", "1e-4")
    assert r.code == 0 and f"--config {cfg} is checked for this world, but train.py gets only" in r.err, r.err
    r = dstk(*base, "--", "train.py", "--deepspeed_config", str(cfg))
    assert r.code == 0 and "--config" not in r.err, r.err
