"""Shared by the benchmark scripts: where results go and what every result records."""

from __future__ import annotations

import csv
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
    from toolkit.run.environment import collect

    return {
        "command": stamp_command(),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "env": collect(),
    }


def write_json(bench: str, data: dict[str, Any]) -> Path:
    return write_record(result_path(bench, "json"), data)


def write_record(path: Path, data: dict[str, Any]) -> Path:
    """`data` as JSON at `path`, with the command and environment that made it (`stamp`)."""
    path.write_text(json.dumps({**stamp(), **data}, indent=2, sort_keys=True) + "\n")
    return path


def command_line() -> str:
    """This benchmark's command line as a user would type it, for the Markdown results."""
    return f"python {stamp_command()}"


def stamp_command() -> str:
    """The script and its arguments, shell-quoted (the `command` every result records)."""
    return " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix(), *sys.argv[1:]])


def output_paths(tag: str, out_dir: Path | None) -> dict[str, Path]:
    """Where a run's csv/md/png/json go: `--out-dir` with plain names (tests), else benchmarks/results with
    `<tag>_<hardware>_<date>` names."""
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        return {k: out_dir / f"{tag}.{k}" for k in ("csv", "md", "png", "json")}
    return {k: result_path(tag, k) for k in ("csv", "md", "png", "json")}


def write_csv(
    path: Path, rows: list[dict[str, Any]], columns: list[str], extrasaction: str = "raise"
) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction=extrasaction)
        writer.writeheader()
        writer.writerows(rows)


# the `--quick` model of the run benchmarks: a 2-block hidden-128 GPT-2, for CI smoke runs
TINY_GPT2: dict[str, Any] = {
    "name": "gpt2-tiny",
    "architecture": "gpt2",
    "n_layers": 2,
    "hidden_size": 128,
    "n_heads": 4,
    "vocab_size": 1024,
    "seq_length": 64,
    "max_position_embeddings": 64,
    "dropout": False,
}


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
    """The cluster to predict against: the one given, or this machine (`local`) after calibrating it for 2
    ranks (reused when this host's cache already holds a calibration)."""
    if cluster is not None:
        return cluster
    dstk("calibrate", "--ranks", "2", "--reuse", env=env)
    return "local"


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
    ranks: int = 2,
    comms_logger: bool = True,
    config_update: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`dstk config` + `dstk launch` (→ `dstk train`) of one layout on 1 node × `ranks` ranks; its summary.json.
    The launch's output is kept in `run`/launch.log.

    The schedule is sized to the run (`--train-steps`, one warm-up step) and the comms logger is on unless
    `comms_logger` is false (it synchronizes around every collective), so the summary's `comm_bytes_per_step`
    is DeepSpeed's own count of the bytes passed to collectives. `config_update` sets DeepSpeed keys that
    `dstk config` has no flag for, in the written config.
    """
    nodes = ["--nodes", "1", "--gpus-per-node", str(ranks)]
    cfg = run / "ds_config.json"
    dstk(
        "config",
        "--model",
        str(model_file),
        "--cluster",
        cluster,
        *nodes,
        *layout,
        "--train-steps",
        str(steps),
        *(["--comms-logger"] if comms_logger else []),
        "--log-dir",
        str(run / "logs"),
        *config_extra,
        "-o",
        str(cfg),
    )
    if config_update:
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), **config_update}, indent=2))
    launched = dstk(
        "launch",
        "--cluster",
        cluster,
        *nodes,
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
    (run / "launch.log").write_text(launched.stdout + launched.stderr)
    return json.loads((run / "summary.json").read_text())
