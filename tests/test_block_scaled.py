"""`--precision mxfp8|nvfp4`: Transformer Engine's block-scaled recipes, priced where the GPU has them and
refused in one line where it does not (toolkit/plan/cost/fp8.py, toolkit/plan/fp8_support.py)."""

from __future__ import annotations

import re

import pytest

from tests.cli import dstk
from toolkit.plan.cost.estimate import estimate
from toolkit.plan.cost.fp8 import BLOCK_SCALED, Linear, cast_traffic, fp8_gemms, weight_copies_bytes
from toolkit.plan.layout import LayoutRequest
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.presets import gpu_table
from toolkit.plan.rules import resolve_layout
from toolkit.report.render import mfu_line

# Transformer Engine's B300 GEMM benchmark, the 5B model's 12 GEMMs per layer (docs/examples/gemm_profiling/
# gemm_profiling.rst @8f2e635): pre-quantized kernels 13.102 ms bf16, 7.161 MXFP8, 3.764 NVFP4
KERNEL_SPEEDUP = {"mxfp8": 13.102 / 7.161, "nvfp4": 13.102 / 3.764}


def _est(model, cluster, **layout):
    return estimate(model, cluster, resolve_layout(model, cluster, LayoutRequest(**layout)))


# ----------------------------------------------------------------------------------------- the hardware


def test_blackwell_has_both_formats_cdna4_mxfp8_and_older_gpus_neither() -> None:
    mxfp8 = {k for k, e in gpu_table().items() if e.get("mxfp8_tflops") is not None}
    nvfp4 = {k for k, e in gpu_table().items() if e.get("nvfp4_tflops") is not None}
    assert nvfp4 == {"b200", "b300", "gb200", "gb300"}
    assert mxfp8 == nvfp4 | {"mi355x", "mi350x"}
    for key in mxfp8:  # MXFP8 runs at the FP8 rate (Blackwell, CDNA4)
        assert gpu_table()[key]["mxfp8_tflops"] == gpu_table()[key]["fp8_tflops"]
    ratios = {k: gpu_table()[k]["nvfp4_tflops"] / gpu_table()[k]["bf16_tflops"] for k in nvfp4}
    assert ratios == {
        "b200": 4,
        "gb200": 4,
        "b300": 6,
        "gb300": 6,
    }  # Blackwell Ultra's FP4 is 1.5x Blackwell's


@pytest.mark.parametrize(
    ("cluster", "precision", "why"),
    [
        ("dgx-h100", "mxfp8", "has no MXFP8 tensor cores"),
        ("hgx-h800", "nvfp4", "has no NVFP4 tensor cores"),
        ("dgx-a100-80g", "mxfp8", "has no MXFP8 tensor cores"),
        ("mi300x-8", "mxfp8", "has no MXFP8 tensor cores"),
        ("mi355x-8", "nvfp4", "has no NVFP4 tensor cores"),  # CDNA4: OCP MXFP4, not NVFP4
        ("cpu", "nvfp4", "is cpu, not a GPU"),
    ],
)
def test_a_gpu_without_the_format_is_refused_in_one_line(cluster, precision, why) -> None:
    r = dstk("estimate", "--model", "llama-7b", "--cluster", cluster, "--precision", precision)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and r.out == ""
    name = precision.upper()
    has = "b200, b300, gb200, gb300, mi355x, mi350x" if precision == "mxfp8" else "b200, b300, gb200, gb300"
    assert re.search(rf"--precision {precision}: {name} GEMMs need {name} tensor cores, and cluster", r.err)
    assert why in r.err and f"GPUs with {name}: {has} (or a cluster file" in r.err


@pytest.mark.parametrize(
    "argv", [["config"], ["config", "--target", "megatron"], ["plan"], ["plan", "--target", "megatron"]]
)
def test_the_runtimes_dstk_configures_refuse_the_recipes_in_one_line(argv, tmp_path) -> None:
    """dstk train runs torchao.float8 (tensorwise); Megatron-DeepSpeed's parser has no --fp8-recipe or
    --fp4-recipe (tests/data/megatron_deepspeed_flags.txt): `dstk estimate` prices the recipes, config and plan
    refuse them (rule mxfp8_nvfp4_are_megatron_core_only)."""
    out = ["-o", str(tmp_path / "ds.json")] if argv[0] == "config" else []
    r = dstk(*argv, "--model", "llama-7b", "--cluster", "dgx-b200", "--precision", "nvfp4", *out)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert re.search(
        r"--precision nvfp4: Transformer Engine's NVFP4 recipe, which neither dstk train \(torchao.float8, "
        r"tensorwise\) nor Megatron-DeepSpeed \(no --fp8-recipe/--fp4-recipe\) runs; use --target megatron-core",
        r.err,
    )
    assert "hf_pipeline" not in r.err  # said once, not per rule of the planner's search
    assert dstk("estimate", "--model", "llama-7b", "--cluster", "dgx-b200", "--precision", "nvfp4").code == 0


# -------------------------------------------------------------------------------------- the cost model


def test_gemms_run_at_the_formats_peak_and_kernel_efficiency() -> None:
    c = load_cluster("dgx-b300")
    mx, nv = fp8_gemms(c, "mxfp8"), fp8_gemms(c, "nvfp4")
    assert (mx.peak, mx.efficiency, mx.operand_bytes) == (4500e12, 0.550, 1 + 1 / 32)
    assert (nv.peak, nv.efficiency, nv.operand_bytes) == (13500e12, 0.349, 0.5 + 1 / 16)
    # the presets' kernel efficiencies are TE's pre-quantized speed-ups at each format's peak ratio
    bf16 = c.gpu_matmul_efficiency
    assert mx.efficiency == pytest.approx(bf16 * KERNEL_SPEEDUP["mxfp8"] * 2250 / 4500, abs=0.001)
    assert nv.efficiency == pytest.approx(bf16 * KERNEL_SPEEDUP["nvfp4"] * 2250 / 13500, abs=0.001)


def test_casts_write_rowwise_and_columnwise_copies_with_their_scales() -> None:
    """MXFP8: one read, two E4M3 copies with an E8M0 scale per 32; NVFP4: an amax pass and the cast, two E2M1
    copies with an E4M3 scale per 16; weights once per optimizer step, both copies kept."""
    x = Linear(100, 32, 64, 32 * 64)
    mx, nv = cast_traffic([x], 2, "mxfp8"), cast_traffic([x], 2, "nvfp4")
    assert mx.forward_bytes == 100 * 32 * (2 + 2 * 1.03125) and mx.backward_bytes == 100 * 64 * (
        2 + 2 * 1.03125
    )
    assert nv.forward_bytes == 100 * 32 * (2 * 2 + 2 * 0.5625) and nv.per_step_bytes == 32 * 64 * (4 + 1.125)
    assert (mx.forward_kernels, nv.forward_kernels) == (1, 2)
    assert weight_copies_bytes([x], 3, "nvfp4") == 3 * 2 * 0.5625 * 32 * 64
    assert BLOCK_SCALED["mxfp8"].element_bytes * 32 == 33  # a byte per element, a byte of scale per 32


@pytest.mark.parametrize("precision", ["mxfp8", "nvfp4"])
def test_a_priced_layout_is_faster_than_bf16_and_slower_than_the_kernels_alone(precision) -> None:
    """Llama 2 70B on 4 DGX B300, TP4 with sequence parallelism, Megatron-style fused blocks: the linear GEMMs
    speed up, the casts and everything that stays bf16 (attention, norms, LM head, communication) do not, so
    the step gains less than TE's kernels do alone (1.83x, 3.48x) — and NVFP4 more than MXFP8."""
    model, c = load_model("llama-70b"), load_cluster("dgx-b300", {"nodes": 4})
    layout = dict(tp=4, zero_stage=1, micro_batch_size=1, global_batch_size=256, fused_kernels=True)
    layout.update(tp_sequence_parallel=True, recompute="selective")
    bf16 = _est(model, c, precision="bf16", **layout)
    low = _est(model, c, precision=precision, **layout)
    speedup = low.tokens_per_s / bf16.tokens_per_s
    assert 1.1 < speedup < KERNEL_SPEEDUP[precision]
    if precision == "nvfp4":
        mxfp8 = _est(model, c, precision="mxfp8", **layout)
        assert low.tokens_per_s > mxfp8.tokens_per_s
    # the narrow copies: weights kept between micro-batches, the saved linear inputs smaller than bf16's
    assert low.memory.fp8_weight_copies > 0 and low.memory.activations < bf16.memory.activations


def test_mfu_is_against_the_formats_peak() -> None:
    """NVIDIA's MFU tables state each run against the peak of its data type (dgxc-benchmarking, "Peak
    Theoretical Throughput": BF16, FP8, NVFP4); model TFLOP/s per GPU — what Megatron-Bridge publishes — is the
    same whatever the denominator."""
    model, c = load_model("llama-7b"), load_cluster("dgx-b200")
    est = {p: _est(model, c, precision=p, fused_kernels=True) for p in ("bf16", "mxfp8", "nvfp4")}
    assert [est[p].peak_flops for p in est] == [2250e12, 4500e12, 9000e12]
    for e in est.values():
        assert e.mfu == pytest.approx(e.tflops_per_gpu * 1e12 / e.peak_flops)
    assert "model FLOPs / nvfp4 peak 9,000 TFLOP/s (its linear layers' GEMMs;" in mfu_line(est["nvfp4"])


def test_mi355x_prices_mxfp8_with_its_fp8_efficiency_fallback() -> None:
    c = load_cluster("mi355x-8")
    assert c.supports("mxfp8") and not c.supports("nvfp4")
    assert fp8_gemms(c, "mxfp8").efficiency == c.gpu_matmul_efficiency  # no FP8/MXFP8 GEMM measurement yet
