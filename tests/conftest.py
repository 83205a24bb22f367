"""Shared environment and fixtures: the JIT op cache inside .venv, offline hubs, one thread per rank, and the
prepared data every run-path test trains on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")


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
    from toolkit.load import load_model
    from toolkit.models import build_model

    out = tmp_path_factory.mktemp("init")
    torch.manual_seed(0)
    build_model(load_model(TEST_MODEL), {}).save_pretrained(out)
    return out
