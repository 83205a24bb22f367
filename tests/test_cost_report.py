"""`dstk plan --tokens/--mfu/--pue/--price-per-gpu-hour/--report`: the cost arithmetic, pinned by hand-written
formulas and published figures (not by calling the cost model), the report's charts and scaling table, and
the import discipline (matplotlib only for PNGs, never torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli import REPO, dstk
from toolkit.errors import UserError
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.query import PlanQuery
from toolkit.plan.scaling import scaling_rows
from toolkit.plan.training_cost import parse_tokens

GPT3 = ["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--global-batch", "1536"]
GIB = 2**30


def _plan(*args: str) -> dict:
    r = dstk(*args, "--json")
    assert r.code == 0, r.err
    return json.loads(r.out)


@pytest.mark.parametrize(
    "text",
    [
        "300e9",
        "3e11",
        "3E11",
        "300B",
        "300b",
        "300 B",
        "0.3T",
        "300G",
        "300_000_000_000",
        "300,000,000,000",
        " 3e+11 ",
    ],
)
def test_token_counts_are_read_generously(text: str) -> None:
    assert parse_tokens(text) == 3e11


@pytest.mark.parametrize("text", ["abc", "-5", "0", "0.5", "inf", "nan", "300X", "", "1e400", "3e11 tokens"])
def test_bad_token_counts_exit_2_naming_tokens(text: str) -> None:
    with pytest.raises(UserError, match="--tokens"):
        parse_tokens(text)
    r = dstk(*GPT3, "--nodes", "64", "--tokens", text)
    assert r.code == 2 and r.err.count("\n") == 1 and "--tokens" in r.err, r.err


ATTENTION_GPT3 = 12 * 96 * 96 * 128 * 2048
"""GPT-3 175B's attention FLOPs per token, 12·L·H·Q·T (PaLM App. B): 2.9e10, 2.8 % of its 6·N."""


def test_gpt3_training_compute_is_the_published_3_14e23_plus_attention() -> None:
    """Brown et al. 2020, Table D.1: GPT-3 175B on 300B tokens took 3.14e23 FLOPs (6·N·D). dstk prices the
    run in the model FLOPs of its MFU, (6·N + 12·L·H·Q·T)·D: the same 6·N·D plus attention, 3.23e23."""
    data = _plan(*GPT3, "--nodes", "64", "--tokens", "300B")
    tr = data["training"]
    n = tr["n_params"]
    assert 6 * n * 300e9 == pytest.approx(3.14e23, rel=0.01)
    assert 6 * n * 300e9 == pytest.approx(3.15e23, rel=0.01)
    assert tr["flops_per_token"] == 6 * n + ATTENTION_GPT3 == data["estimate"]["model_flops_per_token"]
    assert tr["training_flops"] == pytest.approx((6 * n + ATTENTION_GPT3) * 300e9, rel=1e-12)
    assert tr["training_flops"] == pytest.approx(3.23e23, rel=0.002)


def test_time_with_mfu_is_model_flops_over_gpus_peak_mfu() -> None:
    data = _plan(*GPT3, "--nodes", "64", "--tokens", "300e9", "--mfu", "45%", "--price-per-gpu-hour", "2.5")
    flops_per_token = data["estimate"]["model_flops_per_token"]
    gpus, peak = 64 * 8, 312e12  # dgx-a100-80g: 8 GPUs per node, 312 dense bf16 TFLOP/s
    seconds = flops_per_token * 300e9 / (gpus * peak * 0.45)
    hours = seconds / 3600
    tr = data["training"]
    assert tr["time_source"] == "mfu" and tr["mfu"] == 0.45
    assert tr["seconds"] == pytest.approx(seconds, rel=1e-12)
    assert tr["days"] == pytest.approx(seconds / 86400, rel=1e-12)
    assert tr["gpu_hours"] == pytest.approx(gpus * hours, rel=1e-12)
    assert tr["energy_kwh"] == pytest.approx(gpus * 400 * hours * 1.1 / 1000, rel=1e-12)  # 400 W, PUE 1.1
    assert tr["cost"] == pytest.approx(gpus * hours * 2.5, rel=1e-12)
    assert 51.9 < tr["days"] < 52.1  # 3.229e23 FLOPs / (512 × 312e12 × 0.45 FLOP/s) = 4.492e6 s = 52.0 days
    pue = _plan(*GPT3, "--nodes", "64", "--tokens", "300e9", "--mfu", "0.45", "--pue", "1.5")["training"]
    assert pue["energy_kwh"] == pytest.approx(tr["energy_kwh"] * 1.5 / 1.1, rel=1e-12)
    assert pue["cost"] is None and pue["seconds"] == pytest.approx(seconds, rel=1e-12)


def test_time_without_mfu_comes_from_the_plans_tokens_per_s() -> None:
    data = _plan(*GPT3, "--nodes", "64", "--tokens", "300e9")
    tps, flops_per_token = data["estimate"]["tokens_per_s"], data["estimate"]["model_flops_per_token"]
    tr = data["training"]
    assert tr["time_source"] == "plan"
    assert tr["seconds"] == pytest.approx(300e9 / tps, rel=1e-12)
    assert tr["gpu_hours"] == pytest.approx(512 * 300e9 / tps / 3600, rel=1e-12)
    assert tr["mfu"] == pytest.approx(flops_per_token * tps / (512 * 312e12), rel=1e-12)
    # one MFU: the training cost's is the plan's own
    assert tr["mfu"] == pytest.approx(data["estimate"]["mfu"], rel=1e-12)


def test_the_plans_own_mfu_given_back_gives_the_plans_time() -> None:
    """`--mfu` reads the convention the plan prints: feeding the plan's MFU back changes nothing."""
    plan = _plan(*GPT3, "--nodes", "64", "--tokens", "300e9")
    again = _plan(*GPT3, "--nodes", "64", "--tokens", "300e9", "--mfu", repr(plan["estimate"]["mfu"]))
    assert again["training"]["time_source"] == "mfu"
    assert again["training"]["seconds"] == pytest.approx(plan["training"]["seconds"], rel=1e-9)


def test_energy_of_gpt3_matches_patterson_et_al(tmp_path) -> None:
    """Patterson et al. 2021 (arXiv:2104.10350, Table 4): GPT-3 on 10,000 V100s for 14.8 days at 330 W per
    processor and PUE 1.10 took 1,287 MWh. With --mfu set to the utilisation those days imply (in dstk's
    convention: its model FLOPs for 300B tokens over those GPU-days), the energy (GPUs × W × hours × PUE) does
    not depend on how many GPUs the plan uses."""
    import yaml

    from toolkit.plan.cost.flops import model_flops_per_token

    cluster = tmp_path / "v100.yaml"
    spec = {"name": "v100-gpt3", "nodes": 64, "gpus_per_node": 16, "gpu_memory_gib": 31.7}
    spec |= {"gpu_peak_tflops": 125, "intra_node_gb_per_s": 120, "inter_node_gb_per_s": 6}
    spec |= {"cpu_memory_gib": 1500, "supports_bf16": False, "gpu_power_w": 330}
    cluster.write_text(yaml.safe_dump(spec))
    flops = model_flops_per_token(load_model("gpt3-175b")) * 300e9
    mfu = flops / (10_000 * 125e12 * 14.8 * 86400)
    tr = _plan(
        "plan", "--model", "gpt3-175b", "--cluster", str(cluster), "--global-batch", "1536", "--target", "megatron",
        "--tokens", "300e9", "--mfu", str(mfu),
    )["training"]  # fmt: skip
    assert tr["energy_kwh"] / 1000 == pytest.approx(1287, rel=0.01)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--mfu", "0.4"], "--mfu"),
        (["--price-per-gpu-hour", "2"], "--price-per-gpu-hour"),
        (["--pue", "1.2"], "--pue"),
        (["--tokens", "3e11", "--mfu", "0"], "--mfu"),
        (["--tokens", "3e11", "--mfu", "1.5"], "--mfu"),
        (["--tokens", "3e11", "--mfu", "150%"], "--mfu"),
        (["--tokens", "3e11", "--mfu", "high"], "--mfu"),
        (["--tokens", "3e11", "--pue", "0.9"], "--pue"),
        (["--tokens", "3e11", "--price-per-gpu-hour", "-1"], "--price-per-gpu-hour"),
        (["--scaling-nodes", "8,x"], "--scaling-nodes"),
        (["--scaling-nodes", "0,8"], "--scaling-nodes"),
    ],
)
def test_bad_cost_flags_exit_2_naming_the_flag(args: list[str], flag: str) -> None:
    r = dstk(*GPT3, "--nodes", "64", *args)
    assert r.code == 2 and r.err.count("\n") == 1 and flag in r.err, r.err


def test_report_has_cost_memory_chart_and_scaling_table(tmp_path) -> None:
    report = tmp_path / "my report.md"
    data = _plan(
        *GPT3, "--nodes", "32", "--tokens", "300B", "--price-per-gpu-hour", "2", "--report", str(report),
        "--scaling-nodes", "16,32,64",
    )  # fmt: skip
    text = report.read_text()
    for png in ("my report_memory.png", "my report_scaling.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png.replace(' ', '%20')})" in text  # linked, relative, URL-encoded
    tr = data["training"]
    assert "## Training cost" in text and f"{tr['gpu_hours']:,.0f}" in text and f"{tr['cost']:,.0f}" in text
    assert f"{tr['energy_kwh'] / 1000:,.1f} MWh" in text
    # the chosen layout's memory row adds up to the estimate's total
    chosen = next(line for line in text.splitlines() if line.startswith("| chosen:"))
    cells = [float(c) for c in chosen.strip("|").split("|")[1:]]
    total = data["estimate"]["memory_per_gpu_bytes"]["total"] / GIB
    assert cells[-1] == pytest.approx(total, abs=0.051) and sum(cells[:-1]) == pytest.approx(total, abs=0.5)
    # scaling: each row is the plan re-made at that node count with the same global batch
    rows = data["scaling"]
    assert [r["nodes"] for r in rows] == [16, 32, 64]
    for r in rows:
        alone = _plan(*GPT3, "--nodes", str(r["nodes"]))["estimate"]
        assert r["tokens_per_s"] == pytest.approx(alone["tokens_per_s"], rel=1e-12)
        assert r["gpus"] == r["nodes"] * 8
        base = rows[0]["tokens_per_s"] / rows[0]["nodes"]
        assert r["efficiency"] == pytest.approx(r["tokens_per_s"] / r["nodes"] / base, rel=1e-12)
        assert f"| {r['nodes']} | {r['gpus']:,} | {r['layout']} | {r['tokens_per_s']:,.0f} |" in text
    assert rows[0]["efficiency"] == 1.0


def test_scaling_row_when_nothing_fits() -> None:
    rows = scaling_rows(
        load_model("gpt3-175b"),
        load_cluster("cpu"),
        PlanQuery(global_batch_size=8),
        node_counts=[1],
    )
    assert rows[0].tokens_per_s is None and "no layout fits" in (rows[0].reason or "")


def _modules_after(args: list[str]) -> set[str]:
    code = (
        "import json, sys; from toolkit.cli import main; "
        f"rc = main({args!r}); assert rc == 0, rc; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_plan_imports_matplotlib_only_to_write_pngs_and_never_torch(tmp_path) -> None:
    cost = ["--tokens", "300e9", "--mfu", "0.4", "--price-per-gpu-hour", "2", "--nodes", "64"]
    plain = _modules_after([*GPT3, *cost, "--scaling-nodes", "32,64", "--json"])
    assert not plain & {"matplotlib", "torch", "deepspeed", "transformers"}
    with_report = _modules_after([*GPT3, *cost, "--report", str(tmp_path / "r.md")])
    assert "matplotlib" in with_report and not with_report & {"torch", "deepspeed", "transformers"}
