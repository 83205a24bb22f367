"""Shared environment and fixtures: the JIT op cache inside .venv, offline hubs, one thread per rank, and the
prepared data every run-path test trains on."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")
# `--cluster local` reads calibrations cached per host: the suite starts from none (its calibrate test writes
# one here), whatever the user's own cache holds
os.environ["DSTK_CACHE_DIR"] = tempfile.mkdtemp(prefix="dstk-test-cache-")


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory) -> Path:
    """The generated corpus, tokenized (vocab 512) and packed into 64-token sequences."""
    from tests.distributed import dstk_cmd

    root = tmp_path_factory.mktemp("data")
    subprocess.run(
        dstk_cmd("data", "generate", "--out", str(root / "raw"), "--docs-per-domain", "400"),
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    subprocess.run(
        dstk_cmd(
            "data",
            "prepare",
            "--input",
            *[str(p) for p in sorted((root / "raw").glob("*.jsonl"))],
            "--out",
            str(root / "packed"),
            "--seq-length",
            "64",
            "--train-tokenizer",
            "512",
        ),
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    return root / "packed"


@pytest.fixture(scope="session")
def init_weights(tmp_path_factory) -> Path:
    """One random initialisation of the test model, shared by runs that must compute the same function."""
    import torch

    from tests.distributed import TEST_MODEL
    from toolkit.plan.load import load_model
    from toolkit.run.models import build_model

    out = tmp_path_factory.mktemp("init")
    torch.manual_seed(0)
    build_model(load_model(TEST_MODEL), {}).save_pretrained(out)
    return out


STEPS = 10


def train_args(data: Path, steps: int, *extra: str) -> list[str]:
    from tests.distributed import TEST_MODEL

    return ["--model", TEST_MODEL, "--data", str(data), "--steps", str(steps), "--log-every", "1", *extra]


def zero_config(path: Path, stage: int, *extra: str) -> Path:
    """The fp32 config every exactness test shares: micro 4, global 8, lr 3e-3 over 10 steps."""
    from tests.distributed import TEST_MODEL, config

    return config(
        path,
        "--model",
        TEST_MODEL,
        "--zero-stage",
        str(stage),
        "--precision",
        "fp32",
        "--micro-batch",
        "4",
        "--global-batch",
        "8",
        "--lr",
        "3e-3",
        "--train-steps",
        str(STEPS),
        "--warmup-steps",
        "2",
        "--log-dir",
        str(path.parent / f"logs-{path.stem}"),
        *extra,
    )


@pytest.fixture(scope="session")
def zero_runs(tmp_path_factory, prepared_data, init_weights):
    """ZeRO stages 0-3 in fp32 from the same weights on the same data: 10 steps each, checkpointed."""
    from tests.distributed import launch

    root = tmp_path_factory.mktemp("zero")
    jobs = {}
    for stage in range(4):
        cfg = zero_config(root / f"z{stage}.json", stage)
        jobs[stage] = launch(
            root / f"run{stage}",
            cfg,
            train_args(
                prepared_data,
                STEPS,
                "--init-from",
                str(init_weights),
                "--checkpoint-dir",
                str(root / f"ckpt{stage}"),
            ),
        )
        assert jobs[stage].code == 0, jobs[stage].output[-3000:]
    return jobs


@pytest.fixture(scope="session", autouse=True)
def _remove_leaked_shm_buffers():
    """At the end of the session, delete DeepSpeed's per-rank /dev/shm all-reduce buffers that no live process
    maps (its CPU shm op never unlinks them; `dstk launch` cleans its own, this catches direct spawns)."""
    yield
    import glob

    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                mapped.update(line.split()[-1] for line in f if "/dev/shm/deepspeed_allreduce" in line)
        except OSError:
            continue
    for path in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*"):
        if path not in mapped and time.time() - os.path.getmtime(path) > 60:  # not a job starting up
            with contextlib.suppress(OSError):
                os.unlink(path)
