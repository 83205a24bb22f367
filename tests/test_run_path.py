"""The run path on real processes: 2 gloo ranks, the real DeepSpeed engine, HF models built from configs.

Launches are few and shared (session fixtures); each test asserts several things about the runs it reads.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.cli import REPO
from tests.conftest import train_args, zero_config
from tests.distributed import TEST_MODEL, assert_export_generates, config, launch, run_script

pytestmark = pytest.mark.multiprocess
_train_args = train_args


def test_bf16_trains_with_accumulation_eval_and_export(tmp_path, prepared_data) -> None:
    cfg = config(
        tmp_path / "bf16.json",
        "--model",
        TEST_MODEL,
        "--zero-stage",
        "2",
        "--micro-batch",
        "2",
        "--global-batch",
        "8",
        "--lr",
        "3e-3",
        "--train-steps",
        "12",
        "--warmup-steps",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
    )
    assert json.loads(cfg.read_text())["gradient_accumulation_steps"] == 2
    job = launch(
        tmp_path / "run",
        cfg,
        _train_args(prepared_data, 12, "--eval-every", "6", "--checkpoint-dir", str(tmp_path / "ckpt")),
    )
    assert job.code == 0, job.output[-3000:]
    s = job.summary
    assert s["losses"][-1] < s["losses"][0] - 0.5
    assert [e["step"] for e in s["evals"]] == [6, 12] and s["evals"][-1]["perplexity"] < s["evals"][0][
        "perplexity"
    ] * 1.5
    assert list((tmp_path / "logs" / "csv").rglob("*.csv")), "DeepSpeed's CSV monitor wrote nothing"
    assert list((tmp_path / "logs" / "tensorboard").rglob("events.*")), "no TensorBoard events"
    from tests.cli import dstk

    out = tmp_path / "hf"
    r = dstk(
        "export",
        "--model",
        TEST_MODEL,
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--out",
        str(out),
        "--tokenizer",
        str(prepared_data / "tokenizer"),
    )
    assert r.code == 0, r.err
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("The town of Arden has", return_tensors="pt")["input_ids"]
    loss = float(model(input_ids=ids, labels=ids).loss.detach())
    assert loss < math.log(512)  # trained weights, not a fresh initialisation
    assert_export_generates(out)


def test_zero3_construction_never_materialises_the_model(tmp_path) -> None:
    """zero.Init through HfDeepSpeedConfig: partitioned before initialize, RSS growth < 0.6 × fp32 size for
    a 216M model, and the first loss of a properly initialised model (≈ ln(vocab))."""
    proc = run_script(REPO / "tests" / "scripts" / "zero3_build.py", [str(tmp_path)])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for rank in (0, 1):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["n_params"] >= 200e6 and r["all_partitioned"]
        assert r["rss_growth_bytes"] < 0.6 * r["fp32_bytes"], r
        assert abs(r["first_loss"] - math.log(2048)) < 0.6, r


def test_onebit_adam_through_dstk_train(tmp_path, prepared_data, init_weights) -> None:
    """dstk config --optimizer onebit-adam → dstk train wires dstk's own 1-bit Adam into the engine; a resume
    from the step-6 checkpoint (error-feedback buffers in dstk's rank files) continues identically."""
    cfg = zero_config(tmp_path / "onebit.json", 0, "--optimizer", "onebit-adam", "--freeze-step", "4")
    assert json.loads(cfg.read_text())["dstk"]["optimizer"]["type"] == "onebit-adam"
    ckpt = str(tmp_path / "ckpt")
    straight = launch(
        tmp_path / "a",
        cfg,
        _train_args(
            prepared_data,
            12,
            "--init-from",
            str(init_weights),
            "--checkpoint-dir",
            ckpt,
            "--save-every",
            "6",
            "--keep-last",
            "5",
        ),
    )
    assert straight.code == 0, straight.output[-4000:]
    losses = straight.summary["losses"]
    assert losses[-1] < losses[0] - 0.5
    again = launch(
        tmp_path / "b",
        cfg,
        _train_args(prepared_data, 12, "--checkpoint-dir", ckpt, "--resume", "step00000006"),
    )
    assert again.code == 0, again.output[-4000:]
    assert again.summary["losses"][6:] == pytest.approx(losses[6:], rel=1e-6, abs=1e-6)


def test_export_is_the_optimizers_fp32_masters_at_every_zero_stage(tmp_path) -> None:
    """bf16 training at ZeRO-0, 1, 2 and 3 (2 ranks, three steps each in one launch): `dstk export` writes exactly
    the fp32 masters the live optimizer holds (bit for bit), not the bf16 working copy the module trains with
    — which at ZeRO-0 is all the module file holds (the masters are in the optimizer's state beside it). Each
    stage's masters differ from their bf16 rounding, so an export of the working copy would fail here."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.cli import dstk

    flags = ["--model", TEST_MODEL, "--precision", "bf16", "--micro-batch", "2", "--global-batch", "4"]
    flags += [
        "--lr",
        "1e-2",
        "--train-steps",
        "4",
        "--warmup-steps",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    cfgs = [str(config(tmp_path / f"z{s}.json", *flags, "--zero-stage", str(s))) for s in range(4)]
    proc = run_script(REPO / "tests" / "scripts" / "masters_check.py", [str(tmp_path), TEST_MODEL, *cfgs])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for stage in range(4):
        out = tmp_path / f"hf{stage}"
        r = dstk(
            "export", "--model", TEST_MODEL, "--checkpoint", str(tmp_path / f"ckpt{stage}"), "--out", str(out)
        )
        assert r.code == 0, r.err
        exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
        truth = torch.load(tmp_path / f"masters{stage}.pt")
        assert truth and all(m.dtype == torch.float32 for m in truth.values())
        for name, master in truth.items():
            assert torch.equal(exported[name], master), (stage, name)
        assert any(not torch.equal(m, m.bfloat16().float()) for m in truth.values()), stage
