"""Rules of Megatron-Core's runtime (`--target megatron-core`): the knobs only it has, and how they combine.

Scope "core" holds what only Megatron-Core runs — the DeepSpeed engine and Megatron-DeepSpeed refuse it, `dstk
estimate` prices it, `--target megatron-core` writes it; scope "megatron-core" what Megatron-Core cannot run
as dstk would configure it. The combination rules quote Megatron-LM's own checks at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553: megatron/training/arguments.py (A) and
megatron/core/transformer/transformer_config.py (TC).
"""

from __future__ import annotations

from toolkit.plan import pipeline_layout
from toolkit.plan.layout import LayoutRequest
from toolkit.plan.specs import ClusterSpec, ModelSpec

USE = "use --target megatron-core"


def core_only(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """Megatron-Core features dstk prices and writes for Megatron-Core only: DeepSpeed's pipeline engine is
    plain 1F1B and overlaps no TP collective, its MoE keeps experts inside the data-parallel ranks with one
    all-to-all dispatcher, HF builds no MTP module, and Megatron-DeepSpeed has none of these."""
    found = [
        (r.virtual_stages > 1, "--virtual-stages (the interleaved 1F1B schedule)"),
        (r.comm_overlap, "--comm-overlap (--overlap-param-gather, --tp-comm-overlap)"),
        (r.etp is not None, "--etp (MoE parallel folding)"),
        (r.moe_dispatcher is not None, "--moe-dispatcher"),
        (r.moe_routing == "balanced", "--moe-routing balanced (--moe-router-force-load-balancing)"),
        (r.ep_comm_overlap, "--ep-comm-overlap (--overlap-moe-expert-parallel-comm)"),
        (r.pipeline_layout is not None, "--pipeline-layout"),
        (r.cuda_graphs, "--cuda-graphs (--cuda-graph-impl full_iteration)"),
        (m.mtp_layers > 0, f"mtp_layers: {m.mtp_layers} (multi-token prediction)"),
    ]
    named = [what for hit, what in found if hit]
    if named:
        return f"{', '.join(named)}: Megatron-Core's; DeepSpeed and Megatron-DeepSpeed run without; {USE}"
    return None


def layout_fits(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """A `--pipeline-layout` names pp × virtual stages, every block once and the model's MTP layers
    (megatron/core/transformer/pipeline_parallel_layer_layout.py validate_layer_layout)."""
    if r.pipeline_layout is None:
        return None
    return pipeline_layout.problem(r.pipeline_layout, m.n_layers, m.mtp_layers, r.pp, r.virtual_stages)


def etp_needs_moe(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """Expert tensor parallelism splits experts; the dispatcher and the routing act on routed tokens."""
    if m.is_moe:
        return None
    given = [f for f, v in (("--etp", r.etp), ("--moe-dispatcher", r.moe_dispatcher)) if v is not None]
    if r.ep_comm_overlap:
        given.append("--ep-comm-overlap")
    if given:
        return f"{', '.join(given)}: these place routed experts; {m.name} has num_experts=0"
    return None


def ep_overlap_needs(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """`--overlap-moe-expert-parallel-comm` needs EP > 1, the alltoall or flex dispatcher, no full
    recomputation, at most one MTP layer, and with PP > 1 an interleaved schedule (TC:3002-3047)."""
    if not r.ep_comm_overlap:
        return None
    if r.ep == 1:
        return "--ep-comm-overlap: overlaps the expert all-to-alls; it needs --ep > 1"
    if r.moe_dispatcher == "allgather":
        return "--ep-comm-overlap: needs the alltoall, deepep or hybridep dispatcher, not allgather"
    if r.recompute == "full":
        return "--ep-comm-overlap: Megatron-Core refuses it with full recomputation"
    if r.pp > 1 and r.virtual_stages == 1:
        return "--ep-comm-overlap: with --pp > 1 Megatron-Core needs --virtual-stages > 1 for it"
    if m.mtp_layers > 1:
        return f"--ep-comm-overlap: Megatron-Core allows at most 1 MTP layer with it (mtp_layers: {m.mtp_layers})"
    return None


def core_runs(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """What Megatron-Core's training loop cannot run as dstk would configure it: its distributed optimizer
    shards optimizer states and master weights (ZeRO-1, `--use-distributed-optimizer`); ZeRO-2/3, ZeRO++,
    DeepSpeed's offload, 1-bit optimizers and LoRA are DeepSpeed's or dstk train's."""
    if r.zero_stage > 1:
        return f"--zero-stage: Megatron-Core's distributed optimizer is ZeRO-1; stage {r.zero_stage} is DeepSpeed's"
    if r.offload_optimizer != "none" or r.offload_param != "none" or r.offload_activations:
        return "--offload-*: DeepSpeed's ZeRO-Offload/Infinity; Megatron-Core runs without them here"
    if r.optimizer != "adamw" or r.zeropp or r.lora:
        return (
            "--optimizer/--zeropp/--lora: DeepSpeed's or dstk train's; Megatron-Core runs AdamW, full weights"
        )
    if r.sp > 1 and m.n_heads % r.sp:
        return f"--sp: context parallelism over {r.sp} ranks needs n_heads({m.n_heads}) divisible by it"
    return None
