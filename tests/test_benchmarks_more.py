"""CI smoke runs of the pipeline-bubble, dense-vs-MoE and step-memory benchmarks (`--quick`) and of the HF-step
benchmark (`--tiny`), end to end on 2 ranks.

Speed and memory targets live in the benchmarks' output (benchmarks/results/), not here: these check that each
run completes, writes every column, and puts a real measurement beside a real prediction in every row — plus
the exact facts that do not depend on timing (the 1F1B formula, parameter counts per rank).
"""

from __future__ import annotations

import csv
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import REPO

pytestmark = pytest.mark.multiprocess


def _run_quick(
    script: str, out: Path, outputs: tuple[str, ...] = ("md", "png", "json")
) -> list[dict[str, str]]:
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}.py", "--quick", "--cluster", "local", "--out-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for suffix in outputs:
        assert (out / f"{script}_quick.{suffix}").stat().st_size > 0
    record = json.loads((out / f"{script}_quick.json").read_text())
    assert record["env"]["versions"]["deepspeed"] and f"{script}.py --quick" in record["command"]
    with (out / f"{script}_quick.csv").open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == importlib.import_module(f"benchmarks.{script}").COLUMNS
        return list(reader)


def _run_benchmark(script: str, *args: str, timeout: int) -> None:
    """`python benchmarks/SCRIPT.py ARGS` from the repository root; it must exit 0."""
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def _positive_pairs(row: dict[str, str], pairs: tuple[tuple[str, str], ...]) -> None:
    for measured, predicted in pairs:
        assert float(row[measured]) > 0 and float(row[predicted]) > 0, (measured, row)


def test_pipeline_quick_puts_measured_bubble_beside_1f1b_and_dstk(tmp_path) -> None:
    rows = _run_quick("pipeline", tmp_path)
    assert [int(r["m"]) for r in rows] == [1, 4]
    for row in rows:
        m = int(row["m"])
        _positive_pairs(
            row,
            (
                ("step_time_s", "predicted_step_time_s"),
                ("tokens_per_s", "predicted_tokens_per_s"),
                ("peak_memory_stage0_bytes", "predicted_memory_stage0_bytes"),
                ("peak_memory_stage1_bytes", "predicted_memory_stage1_bytes"),
            ),
        )
        assert int(row["global_batch"]) == m * int(row["micro_batch"])
        assert float(row["formula_bubble"]) == pytest.approx(1 / (m + 1))  # (p−1)/(m+p−1), p = 2
        # the measured bubble comes from a noisy fit: it must be a fraction, not necessarily a positive one
        assert math.isfinite(float(row["measured_bubble"])) and float(row["measured_bubble"]) < 1
        predicted, as_measured = float(row["predicted_bubble"]), float(row["predicted_bubble_as_measured"])
        # the measured definition also counts the once-per-step optimizer time, which dstk predicts > 0
        assert 0 < predicted < as_measured < 1, row
    bubbles = [float(r["predicted_bubble"]) for r in rows]
    assert bubbles == sorted(bubbles, reverse=True)  # more micro-batches amortise the same p − 1 slots
    fit = json.loads((tmp_path / "pipeline_quick.json").read_text())["fit"]
    assert fit["slot_s"] > 0 and fit["predicted_slot_s"] > 0


def test_moe_quick_puts_dense_and_moe_beside_their_predictions(tmp_path) -> None:
    rows = {r["run"]: r for r in _run_quick("moe", tmp_path)}
    assert set(rows) == {"dense", "moe-ep2"}
    for row in rows.values():
        _positive_pairs(
            row,
            (
                ("step_time_s", "predicted_step_time_s"),
                ("tokens_per_s", "predicted_tokens_per_s"),
                ("peak_memory_bytes", "predicted_memory_bytes"),
                ("n_params", "predicted_n_params"),
                ("n_active_params", "predicted_n_active_params"),
                ("params_rank_dense", "predicted_params_rank_dense"),
            ),
        )
        # parameter counts are exact: what the engine holds on a rank is what dstk estimate predicts
        for held in ("n_params", "params_rank_dense", "params_rank_expert"):
            assert float(row[held]) == float(row[f"predicted_{held}"]), (held, row)
        assert float(row["comm_bytes_per_step"]) > 0 and math.isfinite(float(row["eval_loss"]))
    dense, moe = rows["dense"], rows["moe-ep2"]
    # 4 experts top-1: each rank holds 2 of them, a token passes through 1 — equal active, ~2.5× total
    assert float(moe["params_rank_expert"]) > 0 == float(dense["params_rank_expert"])
    assert float(moe["n_active_params"]) == pytest.approx(float(dense["n_active_params"]), rel=0.01)
    assert float(moe["n_params"]) > 2 * float(dense["n_params"])
    assert float(moe["final_aux_loss"]) > 0 and float(moe["predicted_expert_comm_s"]) > 0


def test_step_memory_quick_measures_each_phase_beside_its_prediction(tmp_path) -> None:
    rows = {int(r["stage"]): r for r in _run_quick("step_memory", tmp_path, ("md", "json"))}
    assert set(rows) == {0, 3}
    for row in rows.values():
        _positive_pairs(
            row,
            (
                ("fwd_bwd_peak_bytes", "predicted_fwd_bwd_peak_bytes"),
                ("step_peak_bytes", "predicted_step_peak_bytes"),
                ("step_rise_per_shard_param", "predicted_transient_per_shard_param"),
            ),
        )
        # the step's peak is read after a reset to the RSS of that moment: never below what stays after it
        assert float(row["step_peak_bytes"]) >= float(row["after_step_rss_bytes"]) > 0
        assert float(row["step_s"]) > 0 and float(row["step_minor_fault_bytes"]) >= 0
    # ZeRO-3 updates half the parameters on each of the 2 ranks
    assert float(rows[3]["shard_params"]) == float(rows[0]["shard_params"]) / 2
    allreduce = json.loads((tmp_path / "step_memory_quick.json").read_text())["allreduce_bus_gb_per_s"]
    assert set(allreduce) == {"bfloat16", "float32"} and all(v > 0 for v in allreduce.values())


def test_hf_step_tiny_puts_every_step_beside_the_prediction(tmp_path) -> None:
    """`benchmarks/hf_step.py`, the GPU check of the HF target's pricing, as a CPU smoke run (`--tiny`) with
    `--profile`: it completes, and the record holds every step's time, the prediction of the same layout and
    DeepSpeed's own synchronized timers."""
    # fp32: no test depends on the host having native bf16
    args = ["--tiny", "--layers", "2", "--steps", "5", "--precision", "fp32", "--profile"]
    _run_benchmark("hf_step", *args, "--out-dir", str(tmp_path), timeout=600)
    record = json.loads((tmp_path / "hf_step.json").read_text())
    assert record["accelerator"] == "cpu" and record["ranks"] == 2 and record["precision"] == "fp32"
    assert len(record["measured_step_times_s"]) == 5 and record["measured_step_time_s"] > 0
    assert record["predicted"]["step_time_s"] > 0 and 0 < record["measured_mfu"] < 1
    assert any("time (ms) | fwd" in line for line in record["profile"])
    assert "| step time" in (tmp_path / "hf_step.md").read_text()


def test_llm_foundry_tables_are_priced_with_the_shapes_and_settings_their_sweeps_ran(tmp_path: Path) -> None:
    """benchmarks/published_foundry.py reads llm-foundry's two H100 bf16 tables verbatim: every row's MPT shape
    gives the parameter count the table prints (so the shapes and the learned positions are right), and only
    the older sweep's rows run composer's default BACKWARD_POST."""
    foundry = importlib.import_module("benchmarks.published_foundry")
    rows = foundry.read_tables()
    assert len(rows) == 70
    large = [r for r in rows if foundry.LARGE in r["table"]]
    assert len(large) == 18 and {r["gpus"] for r in large} == {128, 256, 512}
    for row in rows:
        post = "--fsdp-backward-prefetch" in foundry.estimate_args(row, tmp_path / "m.yaml")
        assert post == (row not in large)
    priced = foundry.price(rows, tmp_path)
    assert [r["dstk_params"] for r in priced] == [r["n_params"] for r in rows]
    assert all(0.5 < r["ratio"] < 2.0 for r in priced)


def test_recompute_benchmark_puts_three_modes_beside_their_prices(tmp_path: Path) -> None:
    """`benchmarks/recompute.py --tiny`: none, full with early stop and full whole-block recomputation of a real
    HF Llama, each measured and priced; the prices order as the model says (whole > early stop > none)."""
    _run_benchmark("recompute", "--tiny", "--rounds", "1", "--out-dir", str(tmp_path), timeout=300)
    record = json.loads((tmp_path / "recompute.json").read_text())
    rows = {r["mode"]: r for r in record["rows"]}
    assert list(rows) == ["none", "full, early stop", "full, whole blocks"]
    assert all(r["measured_s"] > 0 for r in rows.values())
    predicted = [rows[m]["predicted_s"] for m in rows]
    assert predicted[0] < predicted[1] < predicted[2]
    assert len(record["step_times_s"]["none"]) == 1
    assert "| full, early stop |" in (tmp_path / "recompute.md").read_text()
