"""Run real multi-process DeepSpeed jobs from tests: through `dstk launch` (the user's path) on free ports.

Every test that needs several ranks goes through `launch()`; the JIT op cache lives in `.venv` (Makefile and
conftest set TORCH_EXTENSIONS_DIR), so only the first launch of a fresh checkout builds DeepSpeed's ops.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cli import REPO

TEST_MODEL = str(REPO / "tests" / "models" / "tiny-test-gpt2.yaml")


# Launches a test may run side by side: two 2-rank launches share 2 cores better than one after the other
# (measured in tests/conftest.py), more do worse. Under xdist the other worker's launch is the second.
LAUNCH_SLOTS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Job:
    code: int
    output: str
    run_dir: Path

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "summary.json").read_text())


def dstk_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "toolkit.cli", *args]


def launch(
    run_dir: Path,
    config: Path,
    train_args: list[str],
    ranks: int = 2,
    timeout: float = 900,
    launch_args: list[str] | None = None,
) -> Job:
    """`dstk launch --cluster cpu` with `ranks` ranks, running dstk train with `train_args`."""
    cmd = launch_command(run_dir, config, train_args, ranks, launch_args)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=os.environ.copy()
    )
    return Job(proc.returncode, proc.stdout + proc.stderr, run_dir)


def launch_command(
    run_dir: Path,
    config: Path,
    train_args: list[str],
    ranks: int = 2,
    launch_args: list[str] | None = None,
) -> list[str]:
    """The argv of `launch` (for tests that start the job themselves, e.g. to signal it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return dstk_cmd(
        "launch",
        "--cluster",
        "cpu",
        "--gpus-per-node",
        str(ranks),
        "--config",
        str(config),
        "--run-dir",
        str(run_dir / "launch"),
        "--master-port",
        str(free_port()),
        *(launch_args or []),
        "--",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        *train_args,
    )


def run_script(
    script: Path, args: list[str], ranks: int = 2, timeout: float = 900
) -> subprocess.CompletedProcess:
    """A test script under the deepspeed launcher (for checks that need to stop between build and initialize)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--num_gpus",
        str(ranks),
        "--master_port",
        str(port),
        "--no_local_rank",
        str(script),
        *args,
    ]
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=os.environ.copy()
        )
    finally:
        from toolkit.launcher.job import remove_shm_buffers

        remove_shm_buffers(port)  # DeepSpeed's CPU shm op never unlinks its 66 MB per-rank buffers


def config(path: Path, *args: str) -> Path:
    """`dstk config --cluster cpu ... -o path` (checked by DeepSpeed's classes as always), in fp32 unless the
    test asks for a precision: hosts of this machine kind without native bf16 run torch's bf16 matmul ~75×
    slower than fp32, and no test may depend on the host it runs on."""
    precision = [] if "--precision" in args else ["--precision", "fp32"]
    proc = subprocess.run(
        dstk_cmd("config", "--cluster", "cpu", *args, *precision, "-o", str(path)),
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return path


def assert_export_generates(out: Path) -> None:
    """An exported model's special-token ids are its tokenizer's, so `generate()` stops at end-of-text (forced
    as the third new token here), and its files have the mode the umask gives."""
    import os

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

    model, tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    for cfg in (model.config, model.generation_config):
        assert (cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id) == (
            tok.eos_token_id,
            tok.bos_token_id,
            tok.pad_token_id,
        )
    ids = tok("The town of Arden has", return_tensors="pt")["input_ids"]

    class EndAfterThree(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if input_ids.shape[1] - ids.shape[1] == 2:
                scores[:, :] = -float("inf")
                scores[:, tok.eos_token_id] = 0
            return scores

    new = model.generate(
        ids, max_new_tokens=20, do_sample=False, logits_processor=LogitsProcessorList([EndAfterThree()])
    )
    assert new.shape[1] == ids.shape[1] + 3 and int(new[0, -1]) == tok.eos_token_id
    mask = os.umask(0)
    os.umask(mask)
    assert {p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()} == {0o666 & ~mask}
