"""`dstk launch --slurm`: the sbatch script parses, starts the ranks with `srun`, and hostile names/paths are
quoted or refused.

The generated script is run for real under bash with fake `scontrol` and `srun` executables first on PATH
(tiny shell scripts that record their argv and the rendezvous variables), so the tests see the exact words
srun would receive and whether anything hostile was executed (a canary file). tests/test_multinode.py submits
such scripts to a real two-node SLURM cluster.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli import dstk
from toolkit.errors import UserError
from toolkit.launcher.command import HOSTNAME, launcher_argv
from toolkit.launcher.slurm import BASH_HOSTNAME, IGNORE_USR1, RANK_ENV, STOP_MARGIN_S
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
    """`scontrol` prints $FAKE_HOSTS_FILE and records its argv; `srun` records its argv (NUL-separated) and the
    rendezvous variables it was given."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\nfor a in "$@"; do printf \'%s\\0\' "$a"; done > "$SCONTROL_ARGV"\ncat "$FAKE_HOSTS_FILE"\n'
    )
    (bin_dir / "srun").write_text(
        '#!/bin/sh\nfor a in "$@"; do printf \'%s\\0\' "$a"; done > "$SRUN_ARGV"\n'
        'echo "$MASTER_ADDR:$MASTER_PORT" > "$SRUN_ARGV.env"\n'
    )
    for name in ("scontrol", "srun"):
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
        "SRUN_ARGV": str(tmp_path / "srun.argv"),
    }
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


def _ranks(nodes: int, per_node: int, *program: str, usr1: bool = False) -> list[str]:
    """What srun gets: one task per rank, each setting torch.distributed's variables from SLURM's (and, for
    dstk train, ignoring SIGUSR1 until it listens for it)."""
    tasks = [f"--nodes={nodes}", f"--ntasks-per-node={per_node}", "--kill-on-bad-exit=1"]
    wrapper = (IGNORE_USR1 if usr1 else "") + RANK_ENV
    return [*tasks, "bash", "-c", wrapper, "dstk-rank", sys.executable, *program]


def _argv(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


def _no_canary(tmp_path: Path) -> None:
    assert not [p for p in tmp_path.rglob("*canary*") if p.is_file() and p.name == "canary"]


def test_single_node_hostile_paths_and_arguments_reach_srun_as_exact_words(tmp_path, monkeypatch) -> None:
    """Paths with shell syntax in them reach dstk train as exact words (dstk launch checks train's flags before
    it writes the script, so they are real flags here), relative ones made absolute, and arbitrary words reach
    a user's own script so. A dstk train job checkpoints on SLURM's warning before the time limit and
    requeues itself; a script of the user's gets no such directives."""
    monkeypatch.chdir(tmp_path)  # the script cds here; a relative `touch canary` would land here
    run_dir = tmp_path / "run dir;$(touch canary)`touch canary`#x%j"
    train_dir = tmp_path / "train dir;$(touch canary)`touch canary`%j"
    cfg = tmp_path / "my cfg;$(touch canary).json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')  # dstk launch validates it
    script = tmp_path / "job.sbatch"
    train = ["--model", "tiny-gpt2", "--steps", "5", "--run-dir", str(train_dir), "--checkpoint-dir", "ckpt"]
    r = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 1)), "--config", cfg.name, "--run-dir", str(run_dir),
        "--slurm", str(script), "--time", "2-00:00:00", "--partition", "gpu", "--account", "proj-1",
        "--", *train,
    )  # fmt: skip
    assert r.code == 0, r.err
    text = script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    lead = int(next(d for d in directives if "--signal" in d).rsplit("@", 1)[1])
    assert directives == [
        "#SBATCH --job-name=dstk-tiny-gpt2",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --exclusive",
        "#SBATCH --mem=0",
        "#SBATCH --time=2-00:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj-1",
        f"#SBATCH --signal=B:USR1@{lead}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f'#SBATCH --output="{str(run_dir).replace("%", "%%")}/slurm-%j.out"',
    ]
    assert STOP_MARGIN_S < lead < 600  # two predicted steps and a save of a tiny model, and the margin
    # sbatch reads directives only up to the first command
    first_command = next(i for i, line in enumerate(text.splitlines()) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(text.splitlines()) if line.startswith("#SBATCH"))
    assert f"cd -- {shlex.quote(str(tmp_path))}\n" in text

    proc = _run_script(tmp_path, script, ["gpu-node-7"])
    assert proc.returncode == 0, proc.stderr
    assert _argv(tmp_path / "scontrol.argv") == ["show", "hostnames", "node[1-2]"]
    absolute = [*train[:-1], str(tmp_path / "ckpt"), "--config", str(cfg)]
    assert _argv(tmp_path / "srun.argv") == _ranks(
        1, 4, "-m", "toolkit.cli", "train", *absolute, "--cluster", str(run_dir / "cluster.yaml"), usr1=True
    )
    assert (tmp_path / "srun.argv.env").read_text() == "gpu-node-7:29500\n"
    assert (run_dir / "cluster.yaml").is_file()
    _no_canary(tmp_path)

    extra = [w for word in HOSTILE_WORDS for w in ("--note", word)]
    user_script = str(tmp_path / "my train;$(touch canary).py")
    r = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 1)), "--run-dir", str(run_dir), "--slurm", str(script),
        "--", user_script, *extra,
    )  # fmt: skip
    assert r.code == 0, r.err
    assert not re.search("--signal|--requeue|USR1", script.read_text())
    proc = _run_script(tmp_path, script, ["gpu-node-7"])
    assert proc.returncode == 0, proc.stderr
    assert _argv(tmp_path / "srun.argv") == _ranks(1, 4, user_script, *extra)
    _no_canary(tmp_path)


def test_two_nodes_rank_per_gpu_and_master_addr_from_slurm(tmp_path, monkeypatch) -> None:
    """Whatever launcher the cluster file names for interactive launches (pdsh here), the script's ranks are
    srun tasks, one per GPU, inside the allocation; MASTER_ADDR is its first host, and the cluster's
    interface and env reach the ranks through srun's environment."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')  # dstk launch validates it
    script, run_dir = tmp_path / "job.sbatch", tmp_path / "run"
    cluster = _cluster(tmp_path, 2, network_interface="ib0", env={"NCCL_IB_HCA": "mlx5_0"})
    r = dstk(
        "launch", "--cluster", str(cluster), "--config", str(cfg), "--run-dir", str(run_dir),
        "--slurm", str(script), "--max-restarts", "1", "--cpus-per-task", "64", "--gres", "gpu:a100:4",
        "--master-port", "29611", "--", "--model", "tiny-gpt2", "--steps", "5", "--checkpoint-dir", "ck",
    )  # fmt: skip
    assert r.code == 0, r.err
    text = script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)
    for line in ("--nodes=2", "--ntasks-per-node=4", "--gres=gpu:a100:4", "--cpus-per-task=64"):
        assert f"#SBATCH {line}\n" in text
    assert "--gpus-per-node" not in text and "--exclusive" not in text and "pdsh" not in text
    proc = _run_script(tmp_path, script, ["gpu-a01", "gpu-a02"])
    assert proc.returncode == 0, proc.stderr
    argv = _argv(tmp_path / "srun.argv")
    assert argv[:3] == ["--nodes=2", "--ntasks-per-node=4", "--kill-on-bad-exit=1"]
    assert argv[argv.index("--steps") :] == [
        "--steps", "5", "--checkpoint-dir", str(tmp_path / "ck"), "--config", str(cfg),
        "--cluster", str(run_dir / "cluster.yaml"),
    ]  # fmt: skip
    assert (tmp_path / "srun.argv.env").read_text() == "gpu-a01:29611\n"
    assert "export NCCL_SOCKET_IFNAME=ib0" in text and "export NCCL_IB_HCA=mlx5_0" in text


def test_restart_loop_resumes_after_a_failure(tmp_path, monkeypatch) -> None:
    """The first srun fails, the retry gets `--resume auto`, the script exits with the last status."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "job.sbatch"
    r = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 1)), "--run-dir", str(tmp_path / "run"),
        "--slurm", str(script), "--max-restarts", "2", "--", "train.py", "--lr", "1e-4",
    )  # fmt: skip
    assert r.code == 0, r.err
    bin_dir = _fake_bin(tmp_path)
    calls = tmp_path / "calls"
    (bin_dir / "srun").write_text(
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


def test_the_time_limit_warning_checkpoints_requeues_and_the_requeued_job_resumes(
    tmp_path, monkeypatch
) -> None:
    """SIGUSR1 to the batch shell (SLURM's B:USR1 before the time limit) is passed to the job's ranks with
    `scancel --signal=USR1 JOB` while srun runs; srun ending with 138 (the ranks stopped at a checkpoint)
    makes the script requeue its job, and the same script started again with SLURM_RESTART_COUNT runs the
    resuming command (--resume auto, and never --overwrite-checkpoints again). Ending otherwise after the
    warning is not requeued. (tests/test_multinode.py runs this on a real SLURM cluster.)"""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')
    script = tmp_path / "job.sbatch"
    r = dstk(
        "launch", "--cluster", str(_cluster(tmp_path, 1)), "--config", str(cfg), "--run-dir", str(tmp_path / "r"),
        "--slurm", str(script), "--", "--model", "tiny-gpt2", "--steps", "5", "--checkpoint-dir", "ck",
        "--overwrite-checkpoints",
    )  # fmt: skip
    assert r.code == 0, r.err
    bin_dir = _fake_bin(tmp_path)
    log = tmp_path / "log"
    # srun: says it started, waits for the ranks' USR1, then exits as the ranks do (with $SRUN_EXIT)
    (bin_dir / "srun").write_text(
        f"#!/bin/bash\necho \"srun $*\" >> {log}\ntrap 'echo got-usr1 >> {log}; exit $SRUN_EXIT' USR1\n"
        f"echo $$ > {tmp_path}/started\nfor i in $(seq 400); do sleep 0.05; done\nexit 0\n"
    )
    (bin_dir / "scancel").write_text(  # the ranks of the job: the fake srun
        f'#!/bin/sh\necho "scancel $*" >> {log}\nkill -USR1 "$(cat {tmp_path}/started)"\n'
    )
    (bin_dir / "scancel").chmod(0o755)
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\nif [ "$1" = requeue ]; then echo "requeue $2" >> {log}; else echo n1; fi\n'
    )
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n1"}
    for exit_code, restart in (("138", "0"), ("1", "0"), ("138", "3")):
        log.write_text("")
        (tmp_path / "started").unlink(missing_ok=True)
        job = subprocess.Popen(
            ["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**env, "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": restart, "SRUN_EXIT": exit_code},
        )  # fmt: skip
        while not (tmp_path / "started").exists():
            assert job.poll() is None, job.communicate()
            time.sleep(0.02)
        job.send_signal(signal.SIGUSR1)
        _, err = job.communicate(timeout=30)
        said = log.read_text()
        assert "scancel --signal=USR1 77" in said and "got-usr1" in said, (said, err)
        srun = next(line for line in said.splitlines() if line.startswith("srun "))
        if restart == "0":
            assert "--overwrite-checkpoints" in srun and "--resume" not in srun
        else:
            assert "--resume auto" in srun and "--overwrite-checkpoints" not in srun
            assert "requeued (restart 3)" in err
        if exit_code == "138":
            assert job.returncode == 0 and "requeue 77" in said and "requeueing job 77" in err
        else:
            assert job.returncode == int(exit_code) and "requeue" not in said


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
        "--checkpoint-dir", "ck",
    )  # fmt: skip
    assert r.code == 0, r.err
    proc = _run_script(tmp_path, script, ["good-node", host])
    assert proc.returncode == 1
    assert "refusing host name" in proc.stderr
    assert not (tmp_path / "srun.argv").exists()
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
    assert not (tmp_path / "srun.argv").exists()


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


def test_multi_node_pdsh_refuses_words_its_remote_shell_would_reparse_and_srun_carries_them(
    tmp_path, monkeypatch
) -> None:
    """DeepSpeed's pdsh backend joins the program into a remote shell command line: hostile words stop a pdsh
    launch. Under --slurm the ranks are srun tasks, which get argv without a shell: the same words reach the
    script intact."""
    monkeypatch.chdir(tmp_path)
    cluster = _cluster(tmp_path, 2, hostnames=["a", "b"])
    words = ["x;touch canary", "$(touch canary)", "`id`", "a'b", "line\nbreak", ""]
    for word in words:
        r = dstk(
            "launch", "--cluster", str(cluster), "--run-dir", str(tmp_path / "run"), "--dry-run",
            "--", "train.py", "--note", word,
        )  # fmt: skip
        assert r.code == 2 and "program:" in r.err and "pdsh" in r.err, (word, r.err)
    notes = [w for word in words for w in ("--note", word)]
    script = tmp_path / "job.sbatch"
    r = dstk(
        "launch", "--cluster", str(cluster), "--run-dir", str(tmp_path / "run"), "--slurm", str(script),
        "--", "train.py", *notes,
    )  # fmt: skip
    assert r.code == 0, r.err
    proc = _run_script(tmp_path, script, ["h1", "h2"])
    assert proc.returncode == 0, proc.stderr
    assert _argv(tmp_path / "srun.argv") == _ranks(2, 4, "train.py", *notes)
    _no_canary(tmp_path)


def test_a_slurm_job_of_dstk_train_needs_a_checkpoint_folder_and_real_data(tmp_path, monkeypatch) -> None:
    """Under --slurm dstk train stops into --checkpoint-dir and resumes from it, so one is required; a real
    model (1B+ parameters) without --data would train on the demo corpus: refused, each in one line with
    nothing written. --include/--exclude are SLURM's to decide."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1}')
    script = tmp_path / "job.sbatch"
    base = ["launch", "--cluster", str(_cluster(tmp_path, 1)), "--config", str(cfg), "--slurm", str(script)]
    for flags, train, said in (
        (
            [],
            ["--model", "tiny-gpt2", "--steps", "5"],
            "--checkpoint-dir: a SLURM job of dstk train saves there",
        ),
        (
            [],
            ["--model", "llama-7b", "--steps", "5", "--checkpoint-dir", "ck"],
            "--data: none given, so every run",
        ),
        (["--include", "h1"], ["--model", "tiny-gpt2"], "--include: not with --slurm"),
    ):
        r = dstk(*base, "--run-dir", str(tmp_path / "run"), *flags, "--", *train)
        assert r.code == 2 and r.err.count("\n") == 1 and said in r.err, r.err
        assert not script.exists() and not (tmp_path / "run").exists()


def test_time_limits_and_the_warning_lead() -> None:
    from toolkit.launcher.slurm import signal_lead_s, slurm_seconds

    forms = {"90": 5400, "5:30": 330, "1:00:00": 3600, "2-00": 172800, "2-3:04": 183840, "2-00:00:07": 172807}
    assert {t: slurm_seconds(t) for t in forms} == forms
    with pytest.raises(UserError, match="--time: '1 day'"):
        slurm_seconds("1 day")
    # the plan: a 29.5 s step and an 18.2 s save do not fit DeepSpeed's 30 s kill window
    assert signal_lead_s(29.5, 18.2) == math.ceil(2 * 29.5 + 1.5 * 18.2) + STOP_MARGIN_S == 117
    assert signal_lead_s(1e6, 0) == 65535


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
