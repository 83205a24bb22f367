"""Two "nodes" on this machine, for real: sshd + pdsh and a SLURM cluster (munged, slurmctld, two slurmd) on
the loopback addresses 127.0.0.1 (`node1`) and 127.0.0.2 (`node2`), started and stopped by this module.

`tests/testbed/install.sh` installs the Debian packages when they are missing (as root; the tests fail with its
reason when it cannot), `sshbed.sh` starts sshd on port 2222 with throwaway keys and puts the two names in
/etc/hosts, `slurmbed.sh` starts the SLURM daemons with a throwaway config; the fixture stops them all and
checks nothing is left. The runs compare with the shared single-node runs (`zero_runs`): same weights, data
and config on one node with two ranks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cli import REPO
from tests.conftest import STEPS, train_args, zero_config
from tests.distributed import Job, dstk_cmd, free_port

pytestmark = pytest.mark.multiprocess

BED = REPO / "tests" / "testbed"


@dataclass
class Bed:
    root: Path
    env: dict[str, str]
    """The environment a user of the two nodes has: `ssh` that reaches them (a wrapper first on PATH using
    the bed's ssh config: port, key), and SLURM_CONF for sbatch/squeue/scancel."""

    def cluster(self, path: Path, launcher: str, **extra: object) -> Path:
        data = {
            "name": "two-node",
            "nodes": 2,
            "gpus_per_node": 1,
            "accelerator": "cpu",
            "gpu_memory_gib": 8,
            "gpu_peak_tflops": 1,
            "intra_node_gb_per_s": 10,
            "inter_node_gb_per_s": 5,
            "cpu_memory_gib": 16,
            "launcher": launcher,
            **extra,
        }
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def run(self, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout
        )

    def node(self, action: str, name: str) -> None:
        """`node-down NAME` (the node is lost: its sshd and all it runs killed) or `node-up NAME`."""
        proc = self.run("bash", str(BED / "sshbed.sh"), action, name, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def _bed_processes(root: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(root) in line and not line.lstrip().startswith("Z")]


@pytest.fixture(scope="module")
def bed():
    import shutil
    import tempfile

    # not under pytest's tmp directories: they are 0700, and munged refuses a socket in a path others cannot
    # traverse ("Socket is inaccessible: execute permissions for all required")
    root = Path(tempfile.mkdtemp(prefix="dstk-bed-"))
    root.chmod(0o755)
    env = {**os.environ, "SSHBED_DIR": str(root / "ssh"), "SLURMBED_DIR": str(root / "slurm")}

    def sh(script: str, *args: str, check: bool = True) -> str:
        proc = subprocess.run(
            ["bash", str(BED / script), *args], env=env, capture_output=True, text=True, timeout=900
        )
        if check and proc.returncode != 0:
            pytest.fail(f"tests/testbed/{script} {' '.join(args)}: {(proc.stdout + proc.stderr)[-3000:]}")
        return proc.stdout

    sh("install.sh")
    try:
        sh("sshbed.sh", "up")
        sh("sshbed.sh", "hosts-add")
        nodes = sh("slurmbed.sh", "up")
        assert "node1 idle" in nodes and "node2 idle" in nodes, nodes
        path = f"{root / 'ssh' / 'bin'}{os.pathsep}{env['PATH']}"
        yield Bed(root, {**env, "PATH": path, "SLURM_CONF": str(root / "slurm" / "slurm.conf")})
    finally:
        sh("slurmbed.sh", "down", check=False)
        sh("sshbed.sh", "down", check=False)
        sh("sshbed.sh", "hosts-del", check=False)
    for _ in range(50):  # processes that got SIGTERM may take a moment to go
        if not _bed_processes(root):
            break
        time.sleep(0.1)
    assert not _bed_processes(root), _bed_processes(root)
    assert "# sshbed" not in Path("/etc/hosts").read_text()
    shutil.rmtree(root, ignore_errors=True)


def _launch(
    bed: Bed, cluster: Path, run_dir: Path, cfg: Path, *args: str, launch: tuple[str, ...] = ()
) -> Job:
    proc = bed.run(
        *dstk_cmd(
            "launch", "--cluster", str(cluster), "--config", str(cfg), "--run-dir", str(run_dir / "launch"),
            "--master-port", str(free_port()), *launch, "--", "--run-dir", str(run_dir), "--no-progress", *args,
        )
    )  # fmt: skip
    return Job(proc.returncode, proc.stdout + proc.stderr, run_dir)


def _placed(output: str) -> None:
    """Each rank said where it runs, in pdsh's per-host output: rank 0 on node1, rank 1 on node2."""
    assert any(
        line.startswith("node1: rank 0 of 2 on ") and "(node 0 of 2)" in line for line in output.splitlines()
    )
    assert any(
        line.startswith("node2: rank 1 of 2 on ") and "(node 1 of 2)" in line for line in output.splitlines()
    )


def test_pdsh_launch_on_two_nodes_is_the_one_node_computation(
    tmp_path, bed, zero_runs, prepared_data, init_weights
):
    """`dstk launch --cluster two-node.yaml` (node1, node2, one rank each, sshd on port 2222): DeepSpeed's
    runner starts `deepspeed.launcher.launch` on each node through pdsh/ssh, the ranks find each other over
    gloo, and ZeRO-3 gives the single-node run's losses (fp32, 1e-6). The cluster file's `env` reaches the
    remote shells (the pdsh command exports it), and a run directory a remote shell would re-parse is refused
    before anything starts."""
    cluster = bed.cluster(tmp_path / "two-node.yaml", "pdsh", hostnames=["node1", "node2"], ssh_port=2222,
                          env={"DSTK_BED_MARK": "two nodes"})  # fmt: skip
    cfg = zero_config(tmp_path / "z3.json", 3)
    job = _launch(
        bed,
        cluster,
        tmp_path / "run",
        cfg,
        *train_args(prepared_data, STEPS, "--init-from", str(init_weights)),
    )
    assert job.code == 0, job.output[-4000:]
    _placed(job.output)
    assert (
        "pdsh -S -f 1024 -w node1,node2" in job.output and 'export DSTK_BED_MARK="two nodes";' in job.output
    )
    reference = zero_runs[3].summary
    assert job.summary["losses"] == pytest.approx(reference["losses"], rel=1e-6, abs=1e-6)
    assert job.summary["param_norm"] == pytest.approx(reference["param_norm"], rel=1e-6)

    hostile = tmp_path / "run;$(touch canary)"
    refused = _launch(bed, cluster, hostile, cfg, *train_args(prepared_data, STEPS))
    assert refused.code == 2 and "would be re-parsed by the remote shell" in refused.output, refused.output[
        -2000:
    ]
    assert not list(REPO.glob("canary")) and not list(tmp_path.rglob("canary"))


def test_pdsh_rank_killed_on_node2_restarts_across_both_nodes(
    tmp_path, bed, zero_runs, prepared_data, init_weights
):
    """ZeRO-2 across node1 and node2, checkpoints every 3 steps; SIGKILL the rank on node2 at step 5. Its
    node's launcher exits, rank 0 on node1 fails on the broken gloo connection, pdsh reports the failure, and
    `dstk launch --max-restarts 1` starts both nodes again from step 3: the run ends with the single-node
    run's losses (fp32, 1e-6)."""
    cluster = bed.cluster(tmp_path / "two-node.yaml", "pdsh", hostnames=["node1", "node2"], ssh_port=2222)
    cfg = zero_config(tmp_path / "z2.json", 2)
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--save-every", "3"]
    crash = ["--crash-at-step", "5", "--crash-rank", "1"]
    args = train_args(prepared_data, STEPS, "--init-from", str(init_weights), *ckpt, *crash)
    job = _launch(bed, cluster, tmp_path / "run", cfg, *args, launch=("--max-restarts", "1"))
    assert job.code == 0, job.output[-4000:]
    events = [
        json.loads(x) for x in (tmp_path / "run" / "launch" / "launch_events.jsonl").read_text().splitlines()
    ]
    assert [e["exit_code"] != 0 for e in events] == [True, False], events
    assert f"resumed from {tmp_path / 'ckpt' / 'step00000003'} at step 3" in job.output
    assert job.output.count("node2: rank 1 of 2 on ") == 2  # both attempts placed rank 1 on node2
    reference = zero_runs[2].summary
    assert job.summary["losses"] == pytest.approx(reference["losses"], rel=1e-6, abs=1e-6)


def _sbatch(bed: Bed, script: Path) -> str:
    proc = bed.run("sbatch", "--parsable", str(script), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _wait_gone(bed: Bed, job: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not bed.run("squeue", "-h", "-j", job, "-o", "%T", timeout=30).stdout.strip():
            return
        time.sleep(0.5)
    pytest.fail(f"SLURM job {job} still queued or running after {timeout} s")


def _scontrol(bed: Bed, job: str) -> dict[str, str]:
    out = bed.run("scontrol", "-o", "show", "job", job, timeout=30).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def test_the_time_limit_stops_the_sbatch_job_at_a_checkpoint_and_it_requeues_to_the_uninterrupted_losses(
    tmp_path, bed, zero_runs, prepared_data, init_weights
):
    """The script `dstk launch --slurm` writes for two nodes (the cluster file's interactive launcher is pdsh:
    under --slurm the ranks are srun tasks all the same), in a run directory whose name holds `;`, `$()` and
    backquotes, submitted with the real `sbatch` and a 2-minute `--time`. Its first run is slowed (15 s a
    step from step 2: 135 s, past the limit; slowed 10 s a step it ended about when the warning came, and
    once finished all its steps first) so that SLURM's own time limit comes first: SLURM warns the batch shell
    (`--signal=B:USR1@LEAD`, LEAD from the plan), the shell passes the warning to the ranks, they save a
    checkpoint at a step boundary and exit, and the script requeues the job, which resumes from that
    checkpoint (its ranks unslowed) and ends with the single-node ZeRO-2 run's losses (fp32, 1e-6). One job
    id, one output file for both runs."""
    cluster = bed.cluster(tmp_path / "two-node.yaml", "pdsh")
    cfg = zero_config(tmp_path / "z2.json", 2)
    run_dir = tmp_path / "slurm run;$(touch canary)`touch canary`"
    ckpt = run_dir / "ckpt"
    args = train_args(prepared_data, STEPS, "--init-from", str(init_weights), "--checkpoint-dir", str(ckpt))
    args += ["--save-every", "100", "--inject-fault", "2+:slow=15,first-run"]
    script = tmp_path / "job.sbatch"
    wrote = bed.run(
        *dstk_cmd(
            "launch", "--cluster", str(cluster), "--config", str(cfg), "--run-dir", str(run_dir),
            "--master-port", str(free_port()), "--slurm", str(script), "--time", "2",
            "--", "--run-dir", str(run_dir / "train"), "--no-progress", *args,
        )
    )  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    text = script.read_text()
    assert "srun --nodes=2 --ntasks-per-node=1" in text and "deepspeed" not in text and "pdsh" not in text
    lead = int(re.search(r"#SBATCH --signal=B:USR1@(\d+)", text)[1])
    assert "#SBATCH --requeue" in text and lead < 60  # 2 predicted steps of a tiny model, a save, the margin

    job = _sbatch(bed, script)
    _wait_gone(bed, job, timeout=600)
    out = (run_dir / f"slurm-{job}.out").read_text()
    assert _scontrol(bed, job).get("JobState", "COMPLETED") == "COMPLETED", out[-3000:]
    stopped = re.search(r"stopped by SIGUSR1 after step (\d+); checkpoint", out)
    assert stopped, out[-4000:]
    step = int(stopped[1])
    # SLURM may warn up to 60 s before LEAD (sbatch(1), --signal): as early as the first step's end
    assert 1 <= step < STEPS
    assert f"requeueing job {job}, which resumes there" in out
    assert f"job {job} requeued (restart 1)" in out
    assert f"resumed from {ckpt / f'step{step:08d}'} at step {step}" in out
    assert out.count("rank 0 of 2 on node1 (node 0 of 2)") == 2 and out.count("rank 1 of 2 on node2") == 2
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    assert summary["losses"] == pytest.approx(zero_runs[2].summary["losses"], rel=1e-6, abs=1e-6)
    assert not list(tmp_path.rglob("canary")) and not list(REPO.glob("canary"))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_data_prepare_on_two_slurm_nodes_writes_the_one_node_dataset(tmp_path, bed):
    """`dstk data prepare --executor slurm`: datatrove's SlurmPipelineExecutor submits a job array per stage
    (chained with afterok), the filter and tokenize tasks run on node1 and node2, and the dataset (Arrow rows,
    Megatron files, tokenizer, manifest) is byte for byte the one two local workers write from other shards."""
    from toolkit.data.corpus import write_corpus

    write_corpus(tmp_path / "raw", docs_per_domain=150, seed=0)
    common = ["data", "prepare", "--input", str(tmp_path / "raw"), "--train-tokenizer", "300", "--seq-length",
              "64", "--format", "both", "--validation-fraction", "0.05"]  # fmt: skip
    one = bed.run(*dstk_cmd(*common, "--out", str(tmp_path / "one"), "--workers", "2", "--tasks", "3"))
    assert one.returncode == 0, one.stderr[-3000:]
    two = bed.run(
        *dstk_cmd(
            *common, "--out", str(tmp_path / "two"), "--executor", "slurm", "--tasks", "4",
            "--slurm-partition", "debug", "--slurm-mem-per-cpu", "200M", "--slurm-time", "10",
        )
    )  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    assert "its 4 tasks ran on node1, node2" in two.stderr
    assert _tree(tmp_path / "two") == _tree(tmp_path / "one")
    assert not (tmp_path / "two" / ".dstk-work").exists()


def test_a_lost_node_is_named_and_elastic_goes_on_with_the_node_that_remains(
    tmp_path, bed, zero_runs, prepared_data, init_weights
):
    """ZeRO-2 on node1 and node2 (one rank each), checkpoints every 3 steps; after step 7 node2 is lost: its
    sshd and everything under it killed, and it answers ssh no more. `dstk launch --elastic --max-restarts 1`
    names it, re-plans for node1 alone (1 rank, gradient accumulation 1 → 2, the global batch kept), converts
    the newest complete checkpoint to universal beside it and resumes there over pdsh: the data position is
    exactly the checkpoint's (step × global batch, no row read twice or skipped), the run ends at step 10 with
    the one-node reference's losses (fp32, 1e-4: another reduction order), and it says what it changed. Then,
    with node2 still down, the same launch without --elastic stops before any rank starts, naming node2."""
    from tests.distributed import dstk_cmd

    cluster = bed.cluster(tmp_path / "two-node.yaml", "pdsh", hostnames=["node1", "node2"], ssh_port=2222)
    cfg = zero_config(tmp_path / "z2.json", 2)
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    args = train_args(prepared_data, STEPS, "--init-from", str(init_weights), "--checkpoint-dir", str(ckpt),
                      "--save-every", "3", "--inject-fault", "2+:slow")  # fmt: skip
    launch = ["--cluster", str(cluster), "--config", str(cfg), "--master-port", str(free_port())]
    cmd = dstk_cmd("launch", *launch, "--run-dir", str(run / "launch"), "--max-restarts", "1", "--elastic",
                   "--", "--run-dir", str(run), "--no-progress", *args)  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=bed.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        metrics, deadline = run / "metrics.jsonl", time.time() + 300
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 7):
            assert proc.poll() is None and time.time() < deadline, "the job ended before step 7"
            time.sleep(0.1)
        bed.node("node-down", "node2")
        lost = time.time()
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-4000:]
        events = [json.loads(x) for x in (run / "launch" / "launch_events.jsonl").read_text().splitlines()]
        named = next(e for e in events if "lost_nodes" in e)
        print(f"node2 named {named['time'] - lost:.1f} s after it was lost")
        assert list(named["lost_nodes"]) == ["node2"]
        assert "dstk launch: node node2 does not answer (ssh -p 2222: " in out
        said = [x for x in out.splitlines() if x.startswith("dstk launch: --elastic: node2 lost")]
        assert len(said) == 1, out[-4000:]
        assert (
            "the job goes on node1 with 1 rank(s) instead of 2: dp 2 → 1, gradient accumulation 1 → 2"
            in said[0]
        )
        assert "(global batch 8 kept: each step reads the same rows)" in said[0]
        step = int(re.search(r"it resumes at step (\d+), data position (\d+)", said[0])[1])
        tag = f"step{step:08d}-universal"
        assert 3 <= step <= 6 and said[0].endswith(f"converted to universal as {tag}")
        assert f"node1: resumed from {ckpt / tag} at step {step}" in out
        s = json.loads((run / "summary.json").read_text())
        assert s["world_size"] == 1 and s["layout"]["gradient_accumulation_steps"] == 2
        assert (
            s["data_start_position"] == step * 8 and s["data_position"] == STEPS * 8
        )  # nothing re-read or skipped
        reference = zero_runs[2].summary["losses"]
        assert len(s["losses"]) == STEPS and s["losses"][step:] == pytest.approx(reference[step:], rel=1e-4)

        again = bed.run(*dstk_cmd("launch", *launch, "--run-dir", str(tmp_path / "b" / "launch"), "--",
                                  "--run-dir", str(tmp_path / "b"), "--no-progress", *train_args(prepared_data, STEPS)))  # fmt: skip
        lines = [x for x in again.stderr.splitlines() if x.startswith("dstk launch: ")]
        assert again.returncode == 1 and lines[-1].startswith("dstk launch: node node2 does not answer"), (
            again.stderr
        )
        assert lines[-1].endswith(
            "the job needs its 2 nodes, stopping (--elastic restarts it on the 1 that answer)"
        )
        assert not (tmp_path / "b" / "heartbeat").exists()  # no rank started
    finally:
        if proc.poll() is None:  # the test failed while the job ran: stop it as a user would (dstk launch
            proc.terminate()  # forwards SIGTERM to the whole job, then kills what is left)
            proc.wait(timeout=150)
        bed.node("node-up", "node2")
