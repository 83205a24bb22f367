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
QWEN2_MOE = str(REPO / "tests" / "models" / "tiny-test-qwen2-moe.yaml")


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


def test_hf_moe_blocks_become_deepspeed_moe_layers_routed_exactly_as_hf() -> None:
    """Tiny Mixtral, Qwen2-MoE (shared expert, top-k weights not renormalised) and Qwen3-MoE (renormalised) from
    configs, fp32: after toolkit.parallel.hf_moe.convert_hf_moe (ep = 1, one process) every sparse block is a
    DeepSpeed MoE layer with HF's router as its gate, the logits equal HF's (1e-5), HF's own router loss is
    unchanged (its recording hook still finds the router), and a backward reaches every expert, whose
    parameters DeepSpeed marks as experts (kept out of the data-parallel all-reduce)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "scripts" / "hf_moe_check.py")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("HFMOE ")), None)
    assert proc.returncode == 0 and line, (proc.stdout + proc.stderr)[-3000:]
    for name, r in json.loads(line[len("HFMOE ") :]).items():
        assert r["blocks"] == 2 and r["n_expert_tensors"] == 2 * 4 * 2, (name, r)
        assert r["logits_max_diff"] < 1e-5, (name, r)
        assert r["aux_converted"] == pytest.approx(r["aux_hf"], rel=1e-6) and r["aux_hf"] > 0, (name, r)
        assert r["loss_converted"] == pytest.approx(r["loss_hf"], rel=1e-6), (name, r)
        assert r["expert_grads"] and r["experts_marked"], (name, r)


@pytest.mark.parametrize("model", [MIXTRAL, QWEN2_MOE], ids=["mixtral", "qwen2_moe"])
def test_hf_moe_with_expert_parallelism_is_the_ep1_computation(tmp_path, prepared_data, model: str) -> None:
    """Tiny Mixtral and tiny Qwen2-MoE (whose gated shared expert stays dense, outside DeepSpeed's MoE layer)
    at ZeRO-2 in fp32 on 2 ranks, 10 steps: with --ep 2 each rank holds 2 of the 4 experts of
    every block (exactly the estimate's expert parameters per rank) and the tokens travel by all-to-all, yet
    the losses — HF's router loss included — are those of --ep 1, where every rank holds every expert. Both
    final checkpoints go through `dstk export` (DeepSpeed's per-expert files put back into HF's fused
    tensors for --ep 2) to `from_pretrained` models that give the same logits (1e-4)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.cli import dstk

    runs, logits = {}, {}
    for ep in (1, 2):
        cfg = config(
            tmp_path / f"ep{ep}.json", "--model", model, "--ep", str(ep), "--zero-stage", "2",
            "--precision", "fp32", "--micro-batch", "4", "--global-batch", "8", "--lr", "3e-3",
            "--train-steps", "10", "--warmup-steps", "2", "--log-dir", str(tmp_path / f"logs{ep}"),
        )  # fmt: skip
        ckpt = ["--checkpoint-dir", str(tmp_path / f"ckpt{ep}")]
        runs[ep] = launch(
            tmp_path / f"run{ep}", cfg, _args(prepared_data, 10, model, "--log-every", "1", *ckpt)
        )
        assert runs[ep].code == 0, runs[ep].output[-4000:]
        out = tmp_path / f"hf{ep}"
        exported = dstk("export", "--model", model, "--checkpoint", ckpt[1], "--out", str(out))
        assert exported.code == 0, exported.err
        hf = AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            logits[ep] = hf(input_ids=torch.arange(64).reshape(2, 32)).logits
    assert torch.allclose(logits[2], logits[1], rtol=1e-4, atol=1e-4)
    one, two = runs[1].summary, runs[2].summary
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4, abs=1e-4)
    assert one["losses"][-1] < one["losses"][0]
    predicted = two["predicted"]["params_per_rank"]
    for rank in two["params_on_rank"]:
        assert (
            rank["expert"] == predicted["expert"] == 2 * 2 * (3 * 64 * 128)
        )  # 2 blocks × 2 experts × SwiGLU
