"""Efficiency by shape, not one number: GEMMs pay their tile and wave quantization on a GPU whose SM count is
known (NVIDIA's Matrix Multiplication Background guide §3), and HF's eager RMSNorm and rotary embedding are
priced op by op unless the runtime fuses them (Megatron-style, `--fused-kernels`)."""

from __future__ import annotations

import pytest

from toolkit.plan.cost.compute import kernels_per_block, rmsnorm_eager_passes
from toolkit.plan.cost.estimate import estimate
from toolkit.plan.cost.gemm import quantization_efficiency
from toolkit.plan.layout import LayoutRequest
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.planner import plan
from toolkit.plan.query import PlanQuery
from toolkit.plan.rules import resolve_layout
from toolkit.plan.specs import ModelSpec


def _est(model, cluster, **layout):
    return estimate(model, cluster, resolve_layout(model, cluster, LayoutRequest(**layout)))


def test_wave_quantization_reproduces_the_guides_sawtooth() -> None:
    # guide §3.2, A100 (108 SMs), M = 2304: N = 1536 is exactly 108 tiles of 256×128, one full wave; one more
    # column of tiles (N = 1664) needs a second, mostly idle wave
    assert quantization_efficiency(2304, 1536, 108) == pytest.approx(1.0)
    assert quantization_efficiency(2304, 1664, 108) < 0.75
    assert quantization_efficiency(2304, 3072, 108) == pytest.approx(1.0)
    # large training GEMMs sit near 1, a thin TP shard of a short micro-batch far below
    assert quantization_efficiency(16384, 12288, 108) > 0.97
    assert quantization_efficiency(2048, 512, 108) < 0.7


def test_thin_tensor_parallel_shards_are_predicted_slower_per_flop() -> None:
    model = load_model("llama-7b")
    with_sms = load_cluster("dgx-a100-80g")
    without = with_sms.model_copy(update={"gpu_sm_count": None})
    assert with_sms.gpu_sm_count == 108 and without.gpu_sm_count is None
    wide = {"zero_stage": 1, "micro_batch_size": 4, "global_batch_size": 256, "recompute": "selective"}
    thin = {**wide, "tp": 8, "micro_batch_size": 1, "global_batch_size": 64}
    # at tp=1 and 8k tokens per micro-batch the quantization costs almost nothing
    assert _est(model, with_sms, **wide).mfu == pytest.approx(_est(model, without, **wide).mfu, rel=0.03)
    # at tp=8 and one 2k-token sequence each shard fills too few tiles
    thin_compute = _est(model, with_sms, **thin).time.compute_s / _est(model, without, **thin).time.compute_s
    assert thin_compute > 1.03  # 4.6 % at the time of writing: QKV shard 0.89, MLP shard 0.80 of the slots


def test_hf_eager_rmsnorm_and_rotary_cost_what_they_move() -> None:
    assert rmsnorm_eager_passes(2) == 18 and rmsnorm_eager_passes(4) == 7  # 36h and 28h bytes per token
    llama, gpt2 = load_model("llama-7b"), load_model("gpt2")
    assert kernels_per_block(llama, fused=False) == kernels_per_block(llama) + 2 * 7 + 2 * 5
    assert kernels_per_block(gpt2, fused=False) == kernels_per_block(gpt2)  # LayerNorm, learned positions
    cluster = load_cluster("dgx-a100-80g")
    layout = {"zero_stage": 3, "micro_batch_size": 2, "global_batch_size": 256, "recompute": "selective"}
    eager = _est(llama, cluster, **layout)
    fused = _est(llama, cluster, **layout, fused_kernels=True, flash_attention=True)  # the same attention
    assert 1.05 < eager.time.compute_s / fused.time.compute_s < 1.25
    assert (
        _est(gpt2, cluster, **layout).mfu
        == _est(gpt2, cluster, **layout, fused_kernels=True, flash_attention=True).mfu
    )


def test_the_target_runtime_decides_the_kernels() -> None:
    model, cluster = load_model("llama-7b"), load_cluster("dgx-a100-80g")
    hf = plan(model, cluster, PlanQuery(global_batch_size=256))
    megatron = plan(model, cluster, PlanQuery(global_batch_size=256, scopes=("layout",)))
    flash = plan(model, cluster, PlanQuery(global_batch_size=256, scopes=("layout",), flash_attention=True))
    assert hf is not None and megatron is not None and flash is not None
    assert not hf.best.layout.fused_kernels and megatron.best.layout.fused_kernels
    # HF runs SDPA; Megatron-DeepSpeed as dstk launches it runs CoreAttention unless told --use-flash-attn-v2
    assert hf.best.layout.flash_attention and not megatron.best.layout.flash_attention
    assert flash.best.layout.flash_attention and flash.best.layout.fused_kernels
    assert hf.best.estimate.mfu < flash.best.estimate.mfu
    assert megatron.best.estimate.mfu < flash.best.estimate.mfu


def test_materialized_attention_costs_its_scores_whatever_the_recomputation() -> None:
    """Megatron's CoreAttention writes the b·a·s² scores, softmaxes and drops them out through HBM: a cost
    that scales with a·s per token against the GEMMs' h, so it matters for small models and not for large
    ones (Narayanan et al.'s 1.7B and 175B, full recomputation as they trained), and recomputing the
    attention core (selective) repeats it rather than removing it — only fused attention removes it."""
    cluster = load_cluster("dgx-a100-80g")
    shape = dict(architecture="gpt2", activation="gelu", vocab_size=51200, seq_length=2048)
    small = ModelSpec(name="1.7b", n_layers=24, hidden_size=2304, n_heads=24, **shape)
    large = load_model("gpt3-175b")
    ratios = {}
    for name, model in (("small", small), ("large", large)):
        kept = {}
        for recompute in ("none", "selective", "full"):
            layout = {
                "micro_batch_size": 1,
                "global_batch_size": 8,
                "recompute": recompute,
                "fused_kernels": True,
            }
            core = _est(model, cluster, **layout, flash_attention=False)
            fused = _est(model, cluster, **layout, flash_attention=True)
            ratios[name, recompute] = core.time.compute_s / fused.time.compute_s
            kept[recompute] = core.memory.activations - fused.memory.activations
        # memory: every block keeps its scores at `none`, none at `selective`, the one block being rebuilt at `full`
        assert kept["selective"] == 0 and kept["full"] == pytest.approx(kept["none"] / model.n_layers)
    assert all(r > 1.25 for (name, _), r in ratios.items() if name == "small")
    assert all(1.0 < r < 1.08 for (name, _), r in ratios.items() if name == "large")
    assert ratios["small", "selective"] > ratios["small", "none"]  # the core runs twice
