"""Shared environment and fixtures: the JIT op cache inside .venv, offline hubs, one thread per rank, the
prepared data every run-path test trains on, and how the suite is spread over two pytest-xdist workers.

Why two workers (`make test` runs `-n 2 --dist loadfile`): a 2-rank launch is mostly single-threaded start-up
(dstk launch → deepspeed runner → launch.py, each importing DeepSpeed) before two ranks import torch,
transformers and DeepSpeed. Measured on 2 cores (AVX2 host, tiny model, 10 steps): two launches one after the
other 46.5 s, side by side 32.9 s; four side by side 86 s against 66 s for two pairs, because DeepSpeed's CPU
shared-memory all-reduce spins while it waits. So two at a time, never more.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules that launch processes first, the main one of the shared ZeRO runs before all, so the long ones
    do not start last and leave one worker idle at the end; the other modules that compare with the shared
    runs take their usual place among those that launch, by which time the runs are made (put at the head
    beside the main one, a second such module kept one worker waiting 160 s for them). Each module's tests
    stay together and in order (the xdist scheduler, `--dist loadfile`, gives a whole module to one worker)."""
    module = {id(i): i.nodeid.split("::")[0] for i in items}
    users = [module[id(i)] for i in items if "zero_runs" in i.fixturenames]
    heavy = {module[id(i)] for i in items if i.get_closest_marker("multiprocess")}
    first: dict[str, int] = {}
    for n, item in enumerate(items):
        first.setdefault(module[id(item)], n)

    maker = max(set(users), key=users.count) if users else None  # the module that uses them most

    def key(item: pytest.Item) -> tuple[bool, bool, int]:
        m = module[id(item)]
        return (m != maker, m not in heavy, first[m])

    items.sort(key=key)


def _made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]) -> Any:
    """`make(directory)` once per test run, whichever xdist worker asks first; the others wait for it and get
    the same (pickled) result. Without xdist, a fresh directory of this session."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return make(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # this run's directory, above every worker's own
    result = shared / f"{name}.pickle"
    with FileLock(str(shared / f"{name}.lock")):
        if result.exists():
            return pickle.loads(result.read_bytes())
        (shared / name).mkdir()
        value = make(shared / name)
        result.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory) -> Path:
    """The generated corpus, tokenized (vocab 512) and packed into 64-token sequences."""
    from tests.distributed import dstk_cmd

    def make(root: Path) -> Path:
        generate = ["data", "generate", "--out", str(root / "raw"), "--docs-per-domain", "400"]
        subprocess.run(dstk_cmd(*generate), check=True, cwd=REPO, capture_output=True)
        raw = [str(p) for p in sorted((root / "raw").glob("*.jsonl"))]
        prepare = ["data", "prepare", "--input", *raw, "--out", str(root / "packed"), "--seq-length", "64"]
        subprocess.run(
            dstk_cmd(*prepare, "--train-tokenizer", "512"), check=True, cwd=REPO, capture_output=True
        )
        return root / "packed"

    return _made_once(tmp_path_factory, "data", make)


@pytest.fixture(scope="session")
def init_weights(tmp_path_factory) -> Path:
    """One random initialisation of the test model, shared by runs that must compute the same function."""
    import torch

    from tests.distributed import TEST_MODEL
    from toolkit.plan.load import load_model
    from toolkit.run.models import build_model

    def make(out: Path) -> Path:
        torch.manual_seed(0)
        build_model(load_model(TEST_MODEL), {}).save_pretrained(out)
        return out

    return _made_once(tmp_path_factory, "init", make)


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
    """ZeRO stages 0-3 in fp32 from the same weights on the same data: 10 steps each, checkpointed
    asynchronously at steps 5 and 10 (the step-5 checkpoints are where the resume and convert tests continue
    from; the signal test's synchronous save continues to the same losses). ZeRO-3 also recomputes every
    block through DeepSpeed's checkpointing with the block inputs offloaded (`--offload-activations`): the
    same computation again, which test_zero_stages_are_the_same_computation holds it to."""
    from tests.distributed import launch

    def make(root: Path) -> dict[int, Any]:
        jobs = {}
        for stage in range(4):
            extra = ("--recompute", "full", "--offload-activations") if stage == 3 else ()
            cfg = zero_config(root / f"z{stage}.json", stage, *extra)
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
                    "--save-every",
                    "5",
                    "--async-save",
                    # pipelined snapshots at steps 3, 6, 9, whose writer starts 0.3 s late: the next
                    # optimizer step must wait for it at every stage (test_zero_runs)
                    "--snapshot-every",
                    "3",
                    "--slow-snapshot",
                    "0.3",
                ),
            )
            assert jobs[stage].code == 0, jobs[stage].output[-3000:]
        return jobs

    return _made_once(tmp_path_factory, "zero", make)


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
