"""ZeRO buffer sizes derived from the model, shared by the cost model and the DeepSpeed config generator.

DeepSpeed's defaults (reduce bucket 5e8 elements, prefetch 5e7, live parameters 1e9) are sized for one model
shape; its reduce bucket is allocated at full size whatever the model (2 × 1 GB per rank at ZeRO-1/2 with
overlap in bf16). We derive them from the hidden size the way HF's DeepSpeed integration fills its "auto"
values (transformers.integrations.deepspeed: reduce bucket h², prefetch 0.9·h², persistence threshold 10·h),
and bound the live (and reused) parameters by one block, or DeepSpeed's 1e9 when a block is larger, so one
formula feeds both the generated config and the memory estimate.
"""

from __future__ import annotations

import math
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
    nvme_param_buffer_size: int = 0
    """Elements of one `offload_param` NVMe swap buffer (0 when parameters are not on NVMe)."""
    nvme_max_in_cpu: int = 0
    """`offload_param.max_in_cpu`: parameter elements that, despite NVMe, ZeRO-3 reads back once into a pinned
    host buffer and keeps there (stage3.py:888-911, 984-1003). DeepSpeed's default 1e9 keeps every parameter
    of a rank that owns fewer in host memory; dstk writes 0, so NVMe offload means NVMe."""


PARAM_SWAP_BUFFERS = 5
"""`offload_param.buffer_count` (DeepSpeed's default): the NVMe parameter swap buffers, mlocked in host memory
whatever `pin_memory` says (partitioned_param_swapper.py:124-131); one fetch of a module and its prefetch
must find free ones."""
OPTIMIZER_SWAP_BUFFERS = 4
"""`offload_optimizer.buffer_count`: one sub-group's fp32 master, m, v and gradient are in flight together
(partitioned_optimizer_swapper.py:79-84), so Adam needs 4 without pipelined reads or writes."""


def nvme_param_buffer_size(model: ModelSpec, layout: Layout) -> int:
    """Elements of one NVMe parameter swap buffer: a rank swaps the partition ceil(n/W) of each tensor over
    its ZeRO group W, and the largest must fit one buffer (`More elements {numel} than buffer size`,
    partitioned_param_swapper.py:357); rounded up to 2^20 elements, past DeepSpeed's 1024-byte I/O alignment.
    Sizing it from the whole tensor, as a partition-blind config does, pins W times what is needed."""
    pc = count_params(model)
    dense = max(pc.word_embedding, pc.lm_head, pc.largest_dense_leaf) / layout.tp
    expert = pc.largest_expert_leaf / (layout.ep if pc.fused_experts else 1)
    part = max(dense / layout.zero_dp, expert / max(1, layout.expert_zero_dp))
    return -(-math.ceil(part) // 2**20) * 2**20


def block_params_per_rank(model: ModelSpec, tp: int) -> int:
    """Parameters of the largest block on one TP rank (an MoE block holds its router but not its experts'
    TP shards: experts are split by EP, not TP)."""
    pc = count_params(model)
    dense = pc.block_common + pc.dense_mlp
    moe = pc.block_common + pc.router + pc.num_experts * pc.expert
    return int(max(dense, moe if pc.n_moe_layers else 0) // tp)


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
        nvme_param_buffer_size=int(1e8) if layout.offload_param == "nvme" else 0,
        nvme_max_in_cpu=int(1e9),
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
        nvme_param_buffer_size=nvme_param_buffer_size(model, layout) if layout.offload_param == "nvme" else 0,
    )
