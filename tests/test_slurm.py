"""`dstk launch --slurm`: the sbatch script parses, and hostile names/paths are quoted or refused.

The generated script is run for real under bash with fake `scontrol` and `deepspeed` executables first on
PATH (tiny shell scripts that record their argv), so the tests see the exact words the launcher would receive
and whether anything hostile was executed (a canary file).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.cli import dstk
from toolkit.errors import UserError
from toolkit.launcher.command import HOSTNAME, launcher_argv
from toolkit.launcher.slurm import BASH_HOSTNAME
from toolkit.plan.load import load_cluster

HOSTILE_WORDS = [
    "a b",
    "x;touch canary",
    "$(touch canary)",
    "`touch canary`",
    'it\'s "quoted"',
    "line1\nline2; touch canary",
    "--flag=$HOME",
    "",
]


def _cluster(tmp_path: Path, nodes: int, **extra: object) -> Path:
    import yaml

    data = {
        "name": "test-cluster",
        "nodes": nodes,
        "gpus_per_node": 4,
        "gpu_memory_gib": 80,
        "gpu_peak_tflops": 312,
        "intra_node_gb_per_s": 232,
        "inter_node_gb_per_s": 24,
        "cpu_memory_gib": 1000,
        **extra,
    }
    path = tmp_path / f"cluster-{nodes}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _fake_bin(tmp_path: Path) -> Path:
    """`scontrol` prints $FAKE_HOSTS_FILE and records its argv; `deepspeed` records its argv (NUL-separated)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\nfor a in "$@"; do printf \'%s\\0\' "$a"; done > "$SCONTROL_ARGV"\ncat "$FAKE_HOSTS_FILE"\n'
    )
    (bin_dir / "deepspeed").write_text(
        '#!/bin/sh\nfor a in "$@"; do printf \'%s\\0\' "$a"; done > "$DS_ARGV"\n'
    )
    for name in ("scontrol", "deepspeed"):
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _run_script(tmp_path: Path, script: Path, hosts: list[str]) -> subprocess.CompletedProcess[str]:
    hosts_file = tmp_path / "fake_hosts.txt"
    hosts_file.write_text("".join(h + "\n" for h in hosts))
    env = {
        **os.environ,
        "PATH": f"{_fake_bin(tmp_path)}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "FAKE_HOSTS_FILE": str(hosts_file),
        "SCONTROL_ARGV": str(tmp_path / "scontrol.argv"),
        "DS_ARGV": str(tmp_path / "deepspeed.argv"),
    }
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


def _argv(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


def _no_canary(tmp_path: Path) -> None:
    assert not [p for p in tmp_path.rglob("*canary*") if p.is_file() and p.name == "canary"]


def test_single_node_hostile_paths_and_arguments_reach_deepspeed_as_exact_words(
    tmp_path, monkeypatch
) -> None:
    """Paths with shell syntax in them reach dstk train as exact words (dstk launch checks train's flags before
    it writes the script, so they are real flags here), and arbitrary words reach a user's own script so."""
    monkeypatch.chdir(tmp_path)  # the script cds here; a relative `touch canary` would land here
    run_dir = tmp_path / "run dir;$(touch canary)`touch canary`#x%j"
    train_dir = tmp_path / "train dir;$(touch canary)`touch canary`%j"
    cfg = tmp_path / "my cfg;$(touch canary).json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')  # dstk launch validates it
    script = tmp_path / "job.sbatch"
    train = [
        "--model",
        "tiny-gpt2",
        "--steps",
        "5",
        "--run-dir",
        str(train_dir),
        "--checkpoint-dir",
        str(train_dir),
    ]
    r = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 1)), "--config", str(cfg), "--run-dir", str(run_dir),
        "--slurm", str(script), "--time", "2-00:00:00", "--partition", "gpu", "--account", "proj-1",
        "--", *train,
    )  # fmt: skip
    assert r.code == 0, r.err
    text = script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=dstk-tiny-gpt2",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --exclusive",
        "#SBATCH --mem=0",
        "#SBATCH --time=2-00:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj-1",
        f'#SBATCH --output="{str(run_dir).replace("%", "%%")}/slurm-%j.out"',
    ]
    # sbatch reads directives only up to the first command
    first_command = next(i for i, line in enumerate(text.splitlines()) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(text.splitlines()) if line.startswith("#SBATCH"))

    proc = _run_script(tmp_path, script, ["gpu-node-7"])
    assert proc.returncode == 0, proc.stderr
    assert _argv(tmp_path / "scontrol.argv") == ["show", "hostnames", "node[1-2]"]
    assert _argv(tmp_path / "deepspeed.argv") == [
        "--num_nodes", "1", "--num_gpus", "4", "--master_port", "29500",
        "--no_local_rank", "--module", "toolkit.cli", "train", *train,
        "--config", str(cfg), "--cluster", str(run_dir / "cluster.yaml"),
    ]  # fmt: skip
    assert (run_dir / "hostfile").read_text() == "gpu-node-7 slots=4\n"
    assert (run_dir / "cluster.yaml").is_file()
    _no_canary(tmp_path)

    extra = [w for word in HOSTILE_WORDS for w in ("--note", word)]
    user_script = str(tmp_path / "my train;$(touch canary).py")
    r = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 1)), "--run-dir", str(run_dir), "--slurm", str(script),
        "--", user_script, *extra,
    )  # fmt: skip
    assert r.code == 0, r.err
    proc = _run_script(tmp_path, script, ["gpu-node-7"])
    assert proc.returncode == 0, proc.stderr
    assert _argv(tmp_path / "deepspeed.argv")[-len(extra) - 1 :] == [user_script, *extra]
    _no_canary(tmp_path)


def test_two_nodes_hostfile_and_master_addr_from_slurm(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')  # dstk launch validates it
    script, run_dir = tmp_path / "job.sbatch", tmp_path / "run"
    cluster = _cluster(tmp_path, 2, network_interface="ib0")
    r = dstk(
        "launch", "--cluster", str(cluster), "--config", str(cfg), "--run-dir", str(run_dir),
        "--slurm", str(script), "--max-restarts", "1", "--cpus-per-task", "64", "--gres", "gpu:a100:4",
        "--master-port", "29611", "--", "--model", "tiny-gpt2", "--steps", "5",
    )  # fmt: skip
    assert r.code == 0, r.err
    text = script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)
    for line in ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:a100:4", "--cpus-per-task=64"):
        assert f"#SBATCH {line}\n" in text
    assert "--gpus-per-node" not in text and "--exclusive" not in text
    proc = _run_script(tmp_path, script, ["gpu-a01", "gpu-a02"])
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "hostfile").read_text() == "gpu-a01 slots=4\ngpu-a02 slots=4\n"
    argv = _argv(tmp_path / "deepspeed.argv")
    assert argv[:2] == ["--hostfile", str(run_dir / "hostfile")]
    assert argv[argv.index("--master_addr") + 1] == "gpu-a01"
    assert argv[argv.index("--launcher") + 1] == "pdsh"
    assert argv[argv.index("--master_port") + 1] == "29611"
    assert argv[-6:] == ["--steps", "5", "--config", str(cfg), "--cluster", str(run_dir / "cluster.yaml")]
    assert "export NCCL_SOCKET_IFNAME=ib0" in text and "export MASTER_PORT=29611" in text


def test_restart_loop_resumes_after_a_failure(tmp_path, monkeypatch) -> None:
    """The first launcher call fails, the retry gets `--resume auto`, the script exits with the last status."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "job.sbatch"
    r = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 1)), "--run-dir", str(tmp_path / "run"),
        "--slurm", str(script), "--max-restarts", "2", "--", "train.py", "--lr", "1e-4",
    )  # fmt: skip
    assert r.code == 0, r.err
    bin_dir = _fake_bin(tmp_path)
    calls = tmp_path / "calls"
    (bin_dir / "deepspeed").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\nn=$(wc -l < {calls})\n[ "$n" -ge 2 ]\n'
    )  # fails on the first call only
    hosts = tmp_path / "hosts"
    hosts.write_text("n1\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n1"}
    env |= {"FAKE_HOSTS_FILE": str(hosts), "SCONTROL_ARGV": str(tmp_path / "sc")}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and lines[0].endswith("train.py --lr 1e-4")
    assert lines[1].endswith("train.py --lr 1e-4 --resume auto")
    assert "restart 1/2" in proc.stderr


@pytest.mark.parametrize(
    "host",
    ["node one", "x;touch canary", "$(touch canary)", "`touch canary`", "-oProxyCommand=touch canary", "n'q"],
)
def test_hostile_hostnames_from_slurm_are_refused_before_anything_runs(tmp_path, monkeypatch, host) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')  # dstk launch validates it
    script = tmp_path / "job.sbatch"
    r = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 2)), "--config", str(cfg),
        "--run-dir", str(tmp_path / "run"), "--slurm", str(script), "--", "--model", "tiny-gpt2", "--steps", "5",
    )  # fmt: skip
    assert r.code == 0, r.err
    proc = _run_script(tmp_path, script, ["good-node", host])
    assert proc.returncode == 1
    assert "refusing host name" in proc.stderr
    assert not (tmp_path / "deepspeed.argv").exists()
    assert not (tmp_path / "run" / "hostfile").exists()
    _no_canary(tmp_path)


def test_allocation_with_the_wrong_node_count_stops(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "job.sbatch"
    r = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 2)), "--run-dir", str(tmp_path / "run"),
        "--slurm", str(script), "--", "train.py",
    )  # fmt: skip
    assert r.code == 0, r.err
    proc = _run_script(tmp_path, script, ["only-one"])
    assert proc.returncode == 1 and "the plan is for 2 node(s); SLURM allocated 1" in proc.stderr
    assert not (tmp_path / "deepspeed.argv").exists()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--job-name", "a b"),
        ("--job-name", "x;reboot"),
        ("--job-name", "$(reboot)"),
        ("--job-name", "a\nb"),
        ("--job-name", "my-hetjob"),
        ("--time", "1 day"),
        ("--partition", "gpu;reboot"),
        ("--account", "a b"),
        ("--gres", "gpu 8"),
        ("--run-dir", 'run"dir'),
        ("--run-dir", "run\ndir"),
        ("--run-dir", "run\\dir"),
        ("--run-dir", "packjob"),
        ("--cpus-per-task", "0"),
    ],
)
def test_values_sbatch_cannot_carry_are_refused_naming_the_flag(tmp_path, monkeypatch, flag, value) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "job.sbatch"
    args = ["launch", "--cluster", str(_cluster(tmp_path, 1)), "--slurm", str(script)]
    args += [flag, value] if flag == "--run-dir" else ["--run-dir", str(tmp_path / "run"), flag, value]
    r = dstk(*args, "--", "train.py")
    assert r.code == 2, (r.out, r.err)
    assert flag in r.err and r.err.count("\n") == 1
    assert not script.exists()


def test_slurm_flags_need_slurm(tmp_path) -> None:
    r = dstk("launch", "--cluster", "cpu", "--time", "1:00:00", "--dry-run", "--", "train.py")
    assert r.code == 2 and "--time: only with --slurm" in r.err


def test_multi_node_pdsh_refuses_words_its_remote_shell_would_reparse(tmp_path, monkeypatch) -> None:
    """DeepSpeed's pdsh backend joins the program into a remote shell command line: hostile words stop here."""
    monkeypatch.chdir(tmp_path)
    for word in ["x;touch canary", "$(touch canary)", "`id`", "a'b", "line\nbreak", ""]:
        r = dstk(
            "launch", "--cluster", str(_cluster(tmp_path, 2)), "--run-dir", str(tmp_path / "run"),
            "--slurm", str(tmp_path / "job.sbatch"), "--", "train.py", "--note", word,
        )  # fmt: skip
        assert r.code == 2 and "program:" in r.err and "pdsh" in r.err, (word, r.err)
    ok = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 2)), "--run-dir", str(tmp_path / "run"),
        "--slurm", str(tmp_path / "job.sbatch"), "--", "train.py", "--note", "two words", "--lr=1e-4",
    )  # fmt: skip
    assert ok.code == 0, ok.err


def test_openmpi_backend_gets_every_word_intact_and_a_task_per_gpu(tmp_path, monkeypatch) -> None:
    """mpirun passes argv without a shell, so hostile words are quoted, not refused; DeepSpeed's MPI backends
    refuse --num_nodes/--num_gpus, and mpirun needs a SLURM task per rank."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "job.sbatch"
    cluster = _cluster(tmp_path, 2, launcher="openmpi")
    r = dstk(
        "launch", "--cluster", str(cluster), "--run-dir", str(tmp_path / "run"), "--slurm", str(script),
        "--", "train.py", *HOSTILE_WORDS,
    )  # fmt: skip
    assert r.code == 0, r.err
    assert "#SBATCH --ntasks-per-node=4\n" in script.read_text()
    proc = _run_script(tmp_path, script, ["h1", "h2"])
    assert proc.returncode == 0, proc.stderr
    argv = _argv(tmp_path / "deepspeed.argv")
    assert "--num_nodes" not in argv and "--num_gpus" not in argv
    assert argv[-len(HOSTILE_WORDS) - 1 :] == ["train.py", *HOSTILE_WORDS]
    _no_canary(tmp_path)


def test_launcher_rules_from_deepspeeds_runner(tmp_path) -> None:
    two = load_cluster(str(_cluster(tmp_path, 2, hostnames=["a", "b"])))
    argv = launcher_argv(two, ["train.py"], hostfile="h", master_addr="a", include="a:0,1", cwd="/w")
    # DeepSpeed: "Cannot specify num_nodes/gpus with include/exclude"
    assert "--num_nodes" not in argv and argv[argv.index("--include") + 1] == "a:0,1"
    mpi = load_cluster(str(_cluster(tmp_path, 2, hostnames=["a", "b"], launcher="mpich")))
    with pytest.raises(UserError, match="does not support worker include"):
        launcher_argv(mpi, ["train.py"], hostfile="h", master_addr="a", exclude="b", cwd="/w")
    srun = load_cluster(str(_cluster(tmp_path, 2, hostnames=["a", "b"], launcher="slurm")))
    with pytest.raises(UserError, match="ignores --module"):
        launcher_argv(srun, ["-m", "my.train"], hostfile="h", master_addr="a", cwd="/w")
    assert launcher_argv(srun, ["t.py"], hostfile="h", master_addr="a", cwd="/w")[-1] == "t.py"
    with pytest.raises(UserError, match="working directory"):
        launcher_argv(two, ["t.py"], hostfile="h", master_addr="a", cwd="/my dir")


def test_bash_and_python_hostname_patterns_agree(tmp_path) -> None:
    names = ["node1", "a", "gpu-a01.cluster.local", "n_1", "-x", ".x", "a b", "x;y", "a" * 253, "a" * 254, ""]
    names += ["$(x)", "`x`", "n'q", "é"]
    script = 'r=$1; shift; for h in "$@"; do if [[ $h =~ $r ]]; then echo 1; else echo 0; fi; done'
    out = subprocess.run(
        ["bash", "-c", script, "bash", BASH_HOSTNAME, *names], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(int(bool(HOSTNAME.match(n)))) for n in names]
    assert re.fullmatch(r"[01]+", "".join(out))
