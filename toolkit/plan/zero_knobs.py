"""ZeRO buffer sizes derived from the model, shared by the cost model and the DeepSpeed config generator.

DeepSpeed's defaults (reduce bucket 5e8 elements, prefetch 5e7, live parameters 1e9) are sized for one model
shape; its reduce bucket is allocated at full size whatever the model (2 × 1 GB per rank at ZeRO-1/2 with
overlap in bf16). We derive them from the hidden size the way HF's DeepSpeed integration fills its "auto"
values (transformers.integrations.deepspeed: reduce bucket h², prefetch 0.9·h², persistence threshold 10·h),
and bound the live (and reused) parameters by one block, or DeepSpeed's 1e9 when a block is larger, so one
formula feeds both the generated config and the memory estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.plan.layout import Layout
from toolkit.plan.params import count_params
from toolkit.plan.specs import ModelSpec


@dataclass(frozen=True)
class ZeroKnobs:
    """The `zero_optimization` sizes (elements) dstk writes and the estimate assumes."""

    reduce_bucket_size: int
    allgather_bucket_size: int
    overlap_comm: bool
    contiguous_gradients: bool
    stage3_prefetch_bucket_size: int
    stage3_param_persistence_threshold: int
    stage3_max_live_parameters: int
    stage3_max_reuse_distance: int
    sub_group_size: int


def block_params_per_rank(model: ModelSpec, tp: int) -> int:
    """Parameters of the largest block on one TP rank (an MoE block holds its router but not its experts'
    TP shards: experts are split by EP, not TP)."""
    pc = count_params(model)
    dense = pc.block_common + pc.dense_mlp
    moe = pc.block_common + pc.router + pc.num_experts * pc.expert
    return max(dense, moe if pc.n_moe_layers else 0) // tp


def deepspeed_default_knobs(layout: Layout) -> ZeroKnobs:
    """What DeepSpeed 0.19.8 uses when a config leaves the sizes out (runtime/zero/config.py): the knobs of a
    hand-written config, for estimating it."""
    return ZeroKnobs(
        reduce_bucket_size=int(5e8),
        allgather_bucket_size=int(5e8),
        overlap_comm=layout.zero_stage == 3,
        contiguous_gradients=True,
        stage3_prefetch_bucket_size=int(5e7),
        stage3_param_persistence_threshold=int(1e5),
        stage3_max_live_parameters=int(1e9),
        stage3_max_reuse_distance=int(1e9),
        sub_group_size=int(1e9),
    )


def derive_zero_knobs(model: ModelSpec, layout: Layout) -> ZeroKnobs:
    h = model.hidden_size
    bucket = h * h
    live = min(int(1e9), block_params_per_rank(model, layout.tp))
    return ZeroKnobs(
        reduce_bucket_size=bucket,
        allgather_bucket_size=bucket,
        overlap_comm=True,
        contiguous_gradients=True,
        stage3_prefetch_bucket_size=int(0.9 * bucket),
        stage3_param_persistence_threshold=10 * h,
        stage3_max_live_parameters=live,
        stage3_max_reuse_distance=live,
        # ZeRO-Infinity swaps optimizer state per sub-group; 1e8 keeps NVMe swap buffers at ~0.4 GB each
        sub_group_size=int(1e8) if "nvme" in (layout.offload_optimizer, layout.offload_param) else int(1e9),
    )
