"""MoE on real processes: a GPT-2 turned into DeepSpeed-MoE with expert parallelism over 2 gloo ranks, and HF's
Mixtral at ZeRO-3 with its sparse block as a leaf module."""

from __future__ import annotations

import json

import pytest

from tests.cli import REPO
from tests.distributed import config, launch

pytestmark = pytest.mark.multiprocess
MOE = str(REPO / "tests" / "models" / "tiny-test-moe.yaml")
MIXTRAL = str(REPO / "tests" / "models" / "tiny-test-mixtral.yaml")


def _args(data, steps, model, *extra):
    return ["--model", model, "--data", str(data), "--steps", str(steps), "--log-every", "5", *extra]


def test_gpt2_moe_with_expert_parallelism(tmp_path, prepared_data) -> None:
    cfg = config(
        tmp_path / "moe.json",
        "--model",
        MOE,
        "--ep",
        "2",
        "--zero-stage",
        "1",
        "--precision",
        "fp32",
        "--micro-batch",
        "4",
        "--global-batch",
        "8",
        "--lr",
        "3e-3",
        "--train-steps",
        "30",
        "--warmup-steps",
        "3",
        "--log-dir",
        str(tmp_path / "logs"),
    )
    ckpt = str(tmp_path / "ckpt")
    job = launch(
        tmp_path / "run", cfg, _args(prepared_data, 30, MOE, "--checkpoint-dir", ckpt, "--eval-every", "30")
    )
    assert job.code == 0, job.output[-4000:]
    s = job.summary
    assert s["losses"][-1] < s["losses"][0] - 0.5
    # each rank holds num_experts / ep = 2 of the 4 experts per MoE block, as dstk estimate predicts
    predicted = s["predicted"]["params_per_rank"]
    for rank in s["params_on_rank"]:
        assert rank["expert"] == predicted["expert"]
        assert rank["dense"] == predicted["dense"]
    expert = 64 * 256 + 256 + 256 * 64 + 64  # one GPT-2 MLP of width 64: c_fc + c_proj with biases
    assert predicted["expert"] == 2 * 2 * expert  # 2 blocks × 2 local experts
    # the router's load-balancing loss was added to every micro-batch's loss
    assert len(s["aux_losses"]) == 30 and all(a > 0 for a in s["aux_losses"])
    # a fresh engine loading the checkpoint computes exactly what the trained one did
    again = launch(
        tmp_path / "eval",
        cfg,
        _args(prepared_data, 30, MOE, "--checkpoint-dir", ckpt, "--resume", "auto", "--eval-only"),
    )
    assert again.code == 0, again.output[-4000:]
    assert again.summary["evals"][0]["loss"] == s["evals"][-1]["loss"]


def test_mixtral_trains_at_zero3_with_leaf_sparse_blocks(tmp_path, prepared_data) -> None:
    cfg = config(
        tmp_path / "mixtral.json",
        "--model",
        MIXTRAL,
        "--zero-stage",
        "3",
        "--micro-batch",
        "4",
        "--global-batch",
        "8",
        "--lr",
        "3e-3",
        "--train-steps",
        "20",
        "--warmup-steps",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
    )
    assert "expert_parallel" not in json.loads(cfg.read_text())  # ep = 1: AutoEP is not used
    job = launch(tmp_path / "run", cfg, _args(prepared_data, 20, MIXTRAL))
    assert job.code == 0, job.output[-4000:]
    s = job.summary
    assert s["losses"][-1] < s["losses"][0] - 0.3
