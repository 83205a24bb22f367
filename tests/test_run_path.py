"""The run path on real processes: 2 gloo ranks, the real DeepSpeed engine, HF models built from configs.

Launches are few and shared (session fixtures); each test asserts several things about the runs it reads.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.cli import REPO
from tests.conftest import STEPS, train_args, zero_config
from tests.distributed import TEST_MODEL, assert_export_generates, config, launch, run_script

pytestmark = pytest.mark.multiprocess
_train_args = train_args


def test_zero_stages_are_the_same_computation(zero_runs) -> None:
    """ZeRO is an exact reformulation of data parallelism: same losses to 1e-4 for stages 0-3 (fp32)."""
    reference = zero_runs[0].summary["losses"]
    assert len(reference) == STEPS and reference[-1] < reference[0] - 0.5  # and it learns
    for stage in (1, 2, 3):
        losses = zero_runs[stage].summary["losses"]
        assert losses == pytest.approx(reference, rel=1e-4), f"stage {stage}"


def test_model_state_bytes_match_the_estimate(zero_runs) -> None:
    """dstk estimate's engine model states for the cpu cluster equal what the most loaded rank's engine holds
    (2 %); the estimate is per-GPU worst case, so no rank holds more."""
    for stage, job in zero_runs.items():
        s = job.summary
        predicted = s["predicted"]["engine_model_states_bytes"]["total"]
        measured = s["model_state_bytes"]["after_backward"]
        assert max(measured) == pytest.approx(predicted, rel=0.02), (
            f"stage {stage}: {measured} vs {predicted}"
        )
        assert all(m <= predicted * 1.02 for m in measured)
    z0 = zero_runs[0].summary["model_state_bytes"]["after_step"][0]
    z3 = zero_runs[3].summary["model_state_bytes"]["after_step"][0]
    assert z3 < z0  # partitioned states per rank


def test_summary_metrics_and_monitors(zero_runs) -> None:
    s = zero_runs[2].summary
    assert s["tokens_per_s"] > 0 and s["tflops_per_gpu"] > 0 and 0 < s["mfu"] < 1
    assert s["predicted"]["step_time_s"] > 0 and len(s["peak_memory_bytes"]) == 2
    lines = [json.loads(x) for x in (zero_runs[2].run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {"loss", "lr", "tokens_per_s", "mfu", "rss_bytes"} <= set(lines[-1])
    assert "Measured vs predicted" in zero_runs[2].output


def test_resume_continues_exactly(tmp_path, zero_runs, prepared_data, init_weights) -> None:
    """10 straight steps == 5 steps, stop, --resume auto for 5 more (fp32, ZeRO-2), to 1e-6."""
    cfg = config(
        tmp_path / "z2.json",
        "--model",
        TEST_MODEL,
        "--zero-stage",
        "2",
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
        str(tmp_path / "logs"),
    )
    ckpt = tmp_path / "ckpt"
    common = ["--init-from", str(init_weights), "--checkpoint-dir", str(ckpt)]
    first = launch(tmp_path / "a", cfg, _train_args(prepared_data, 5, *common))
    assert first.code == 0, first.output[-3000:]
    second = launch(tmp_path / "b", cfg, _train_args(prepared_data, STEPS, *common, "--resume", "auto"))
    assert second.code == 0, second.output[-3000:]
    assert "resumed from" in second.output
    straight = zero_runs[2].summary["losses"]
    resumed = second.summary["losses"]
    assert len(resumed) == STEPS
    assert resumed[-1] == pytest.approx(straight[-1], rel=1e-6, abs=1e-6)
    assert resumed[5:] == pytest.approx(straight[5:], rel=1e-6, abs=1e-6)


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
        "20",
        "--warmup-steps",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
    )
    assert json.loads(cfg.read_text())["gradient_accumulation_steps"] == 2
    job = launch(
        tmp_path / "run",
        cfg,
        _train_args(prepared_data, 20, "--eval-every", "10", "--checkpoint-dir", str(tmp_path / "ckpt")),
    )
    assert job.code == 0, job.output[-3000:]
    s = job.summary
    assert s["losses"][-1] < s["losses"][0] - 0.5
    assert [e["step"] for e in s["evals"]] == [10, 20] and s["evals"][-1]["perplexity"] < s["evals"][0][
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
    a 300M model, and the first loss of a properly initialised model (≈ ln(vocab))."""
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
