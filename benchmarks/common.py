"""Shared by the benchmark scripts: where results go and what every result records."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]


def hardware_tag() -> str:
    """`cpu` or the GPU model, for result file names `<bench>_<hardware>_<date>.*`."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0).replace(" ", "-").lower()
    except ImportError:
        pass
    return f"cpu-{platform.machine()}"


def result_path(bench: str, suffix: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{bench}_{hardware_tag()}_{dt.date.today().isoformat()}.{suffix}"


def stamp() -> dict[str, Any]:
    """The command that made a result and the environment it ran in (`dstk env`)."""
    from toolkit.commands.env import collect

    return {
        "command": " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "env": collect(),
    }


def write_json(bench: str, data: dict[str, Any]) -> Path:
    path = result_path(bench, "json")
    path.write_text(json.dumps({**stamp(), **data}, indent=2, sort_keys=True) + "\n")
    return path


# ---- running dstk as a user would (the benchmarks drive the CLI, not its internals) ----------------------


def dstk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """One dstk command as a subprocess, as a user would type it; stops the benchmark on failure."""
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args], cwd=REPO, capture_output=True, text=True, env=env
    )
    if proc.returncode:
        raise SystemExit(f"dstk {' '.join(args[:2])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


def bench_env() -> dict[str, str]:
    """One intra-op thread per rank: 2 ranks on 2 cores, neither starving the other (or gloo)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    return env


def free_port() -> int:
    """A free rendezvous port, so benchmarks and tests running at once do not collide on 29500."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_for(tmp: Path, cluster: str | None, env: dict[str, str]) -> str:
    """The cluster to predict against: the one given, or this machine calibrated for 2 ranks."""
    if cluster is not None:
        return cluster
    path = tmp / "cluster.yaml"
    dstk("calibrate", "--ranks", "2", "-o", str(path), env=env)
    return str(path)


def prepare_data(tmp: Path, model: dict[str, Any], docs_per_domain: int) -> Path:
    """The generated demo corpus, tokenized for `model` (`dstk data generate` + `dstk data prepare`)."""
    dstk("data", "generate", "--out", str(tmp / "raw"), "--docs-per-domain", str(docs_per_domain))
    dstk(
        "data",
        "prepare",
        "--input",
        *map(str, sorted((tmp / "raw").glob("*.jsonl"))),
        "--out",
        str(tmp / "data"),
        "--seq-length",
        str(model["seq_length"]),
        "--train-tokenizer",
        str(min(model["vocab_size"], 4096)),
    )
    return tmp / "data"


def train(
    run: Path,
    model_file: Path,
    cluster: str,
    data: Path,
    steps: int,
    layout: list[str],
    env: dict[str, str],
    config_extra: tuple[str, ...] = (),
    train_extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """`dstk config` + `dstk launch` (→ `dstk train`) of one layout on 1 node × 2 ranks; its summary.json.

    The schedule is sized to the run (`--train-steps`, one warm-up step) and the comms logger is on, so the
    summary's `comm_bytes_per_step` is DeepSpeed's own count of the bytes passed to collectives.
    """
    ranks = ["--nodes", "1", "--gpus-per-node", "2"]
    cfg = run / "ds_config.json"
    dstk(
        "config",
        "--model",
        str(model_file),
        "--cluster",
        cluster,
        *ranks,
        *layout,
        "--train-steps",
        str(steps),
        "--comms-logger",
        "--log-dir",
        str(run / "logs"),
        *config_extra,
        "-o",
        str(cfg),
    )
    dstk(
        "launch",
        "--cluster",
        cluster,
        *ranks,
        "--config",
        str(cfg),
        "--run-dir",
        str(run / "launch"),
        "--master-port",
        str(free_port()),
        "--",
        "--model",
        str(model_file),
        "--data",
        str(data),
        "--steps",
        str(steps),
        "--run-dir",
        str(run),
        "--log-every",
        str(steps),
        "--no-progress",
        *train_extra,
        env=env,
    )
    return json.loads((run / "summary.json").read_text())
