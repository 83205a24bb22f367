"""Step time of a layout: pipeline schedule, model-parallel and data-parallel communication, optimizer, offload.

Per micro-batch, a rank of the slowest pipeline stage computes (see :mod:`toolkit.plan.cost.compute`) and waits on
tensor-parallel all-reduces (4 per block per micro-batch, 6 with full recomputation; Narayanan et al. 2021
§3.2 — not overlapped), expert all-to-alls (dispatch + combine, forward and backward; Rajbhandari et al.
2022, DeepSpeed-MoE) and Ulysses all-to-alls (q, k, v and output; Jacobs et al. 2023). A 1F1B pipeline runs
m + p - 1 such slots per step, the p - 1 extra being the bubble.

Data-parallel traffic per ZeRO stage, as DeepSpeed schedules it (Rajbhandari et al. 2020, §7):
- stage 0: one all-reduce of the gradients at the accumulation boundary, after backward (not overlapped);
- stage 1: a reduce-scatter in the paper, overlapped with the last backward, then an all-gather of the
  updated parameters after the step. DeepSpeed 0.19.8 does not reduce-scatter: `average_tensor` (zero/
  stage_1_and_2.py), with `use_multi_rank_bucket_allreduce` at its default (True), all-reduces each whole
  bucket and every rank keeps its own slice — 2(n-1)/n·Ψ bytes, so ZeRO-1/2 move 1.5× ZeRO-0's volume
  (DeepSpeed's comms logger in benchmarks/zero_stages.py, 2026-12-03: 205 MB vs 142 MB per step);
- stage 2: the same bucket all-reduces in every micro-batch (gradients are partitioned as they are
  produced), overlapped with its backward, plus the same all-gather;
- stage 3: per micro-batch an all-gather of parameters for forward and one for backward, prefetched behind
  compute, and a reduce-scatter of gradients behind backward (3Ψ per micro-batch instead of 2Ψ per step).
Only what does not fit in the compute it overlaps with, plus one bucket that cannot overlap, is exposed.
With sequence parallelism these collectives span the data- and sequence-parallel ranks together
(`Layout.zero_dp`): each SP rank computes gradients from its own slice of the tokens.
PyTorch FSDP (`--fsdp`, published FSDP runs) moves the same volumes per micro-batch in one all-gather and one
reduce-scatter per wrapped block, a block ahead of compute (`_fsdp_exposed_s`).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.plan.cost import activations as act
from toolkit.plan.cost import comm, moe
from toolkit.plan.cost.compute import StageCompute, block_linears, early_stop_skips
from toolkit.plan.cost.fp8 import amax_bytes
from toolkit.plan.layout import Layout
from toolkit.plan.specs import ClusterSpec, ModelSpec
from toolkit.plan.zero_knobs import ZeroKnobs

# Bytes Adam reads and writes per parameter per step: fp32 master, gradient, m, v read; master, m, v written,
# plus the 16-bit working copy (mixed precision). fp32 training has no separate master or 16-bit copy.
ADAM_BYTES_PER_PARAM = {"mixed": 4 * 4 + 3 * 4 + 2, "fp32": 4 * 4 + 3 * 4}
# torch.optim.AdamW's single-tensor loop, which dstk's configs select on the CPU accelerator (`torch_adam`;
# torch has no for-each kernels there): decay (2 fp32 passes), lerp of m (3), v·β2 then + g² (2 + 3), √v,
# / bias correction, + ε (2 each), the addcdiv into the parameter (4) — 20 passes; then the 16-bit copy.
UNFUSED_ADAM_BYTES_PER_PARAM = {"mixed": 20 * 4 + 4 + 2, "fp32": 20 * 4}
# NVMe traffic of ZeRO-Infinity's optimizer per parameter and step: the fp32 gradient written in backward, then
# master, m, v and gradient read and master, m, v written (DeepSpeed 0.19.8 stage3.py:2910-2927)
NVME_OPTIMIZER_BYTES_PER_PARAM = 4 + 16 + 12


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step, by cause; `total_s` is their sum."""

    compute_s: float
    """Forward, backward and recomputation of all micro-batches on the slowest stage."""
    pipeline_bubble_s: float
    model_parallel_comm_s: float
    """Tensor-parallel, expert and sequence-parallel collectives plus pipeline sends."""
    data_parallel_comm_s: float
    """The part of gradient/parameter traffic that compute does not hide."""
    optimizer_s: float
    """The optimizer step plus the engine's fixed per-step host cost (`step_overhead_ms`)."""
    offload_s: float
    """Exposed host/NVMe transfers of ZeRO-Offload / ZeRO-Infinity."""

    @property
    def total_s(self) -> float:
        return (
            self.compute_s
            + self.pipeline_bubble_s
            + self.model_parallel_comm_s
            + self.data_parallel_comm_s
            + self.optimizer_s
            + self.offload_s
        )


@dataclass(frozen=True)
class StageLoad:
    """What the slowest stage's rank computes and holds, as the step-time model needs it."""

    compute: StageCompute
    dense_params: float
    """Non-expert parameters on the rank (after TP/PP, before ZeRO)."""
    expert_params: float
    """Expert parameters on the rank (after EP, before ZeRO)."""
    n_blocks: int
    n_moe_blocks: int
    overlap_slowdown: float = 1.0
    """Compute time per unit of work while a data-parallel collective runs beside it (NCCL's kernel holds some
    SMs; toolkit.plan.cost.compute.slowed_by_collectives); 1 where nothing overlaps."""
    ep_overlap_slowdown: float = 1.0
    """The same beside an expert all-to-all under `--ep-comm-overlap` (its SMs: moe.dispatcher_sms)."""


def _behind(comm_s: float, compute_s: float, slowdown: float) -> float:
    """Seconds a collective of `comm_s` adds when it runs beside `compute_s` of compute that it slows by
    `slowdown` while it holds its SMs: the compute done meanwhile advances at 1/slowdown, so the pair takes
    max(comm, compute + comm·(1 − 1/slowdown)). Lee et al. 2025 ("Characterizing Compute-Communication Overlap
    in GPU-Accelerated Distributed Deep Learning", arXiv:2507.03114) measure 18.9 % average compute slowdown
    under overlap on A100/H100/MI250/MI210; NVIDIA's developer forum ("Compute-Communication Overlap Causes
    Severe GEMM Performance Degradation because of Tail Effect", 2025) shows an H100 all-gather holding 24 of
    132 SMs and a one-wave GEMM beside it taking two waves."""
    if comm_s <= 0:
        return 0.0
    return max(comm_s - compute_s, comm_s * (1 - 1 / slowdown), 0.0)


def _groups(layout: Layout, cluster: ClusterSpec) -> dict[str, comm.Group]:
    return {
        "tp": comm.group(layout.tp, 1, cluster),
        "sp": comm.group(layout.sp, layout.tp, cluster),
        # ZeRO/FSDP shards and gradients reduce over data- and sequence-parallel ranks (Layout.zero_dp); SP is
        # placed next to TP, so that group is every rank with the same TP index
        "dp": comm.group(layout.zero_dp, layout.tp, cluster),
        "ep": moe.ep_group(layout, cluster),
        # expert replicas at stride tp·ep inside DeepSpeed's data-parallel ranks, at stride etp·ep in
        # Megatron-Core's folded expert grid (toolkit/plan/cost/moe.py)
        "edp": comm.group(layout.expert_zero_dp, (layout.etp or layout.tp) * layout.ep, cluster),
    }


def _micro_comm_s(model: ModelSpec, cluster: ClusterSpec, layout: Layout, load: StageLoad, e: int) -> float:
    """Tensor/expert/sequence-parallel collectives and pipeline sends of one micro-batch on one rank."""
    g = _groups(layout, cluster)
    tokens = layout.micro_batch_size * model.seq_length / layout.sp
    h = model.hidden_size
    full = layout.recompute == "full"
    t = 0.0
    t += _tp_comm_s(model, cluster, layout, load, e)
    t += moe.moe_comm_s(model, cluster, layout, load.n_moe_blocks, e)
    if layout.sp > 1:
        passes = 3 if full else 2
        per_call = sp_all_to_all_bytes(model, layout, 1, e) / passes
        t += passes * load.n_blocks * comm.all_to_all_s(per_call, g["sp"], cluster)
    if layout.pp > 1:
        crosses = comm.crosses_network(layout.tp * layout.sp * layout.dp, cluster)
        # activations forward and their gradients backward; Megatron's scatter/gather sends 1/t per rank; an
        # interleaved schedule sends at every one of a rank's v chunk boundaries
        t += 2 * layout.virtual_stages * comm.p2p_s(tokens * h * e / layout.tp, crosses, cluster)
    if layout.fp8_recipe == "delayed" and load.n_blocks:
        # Transformer Engine reduces its amaxes over fp8_group, Megatron's data-parallel group, after each
        # forward and each backward (toolkit/plan/cost/fp8.py)
        linears = block_linears(model, tokens, layout.tp, load.n_moe_blocks > 0, layout.ep)
        t += 2 * comm.all_reduce_s(amax_bytes(linears, load.n_blocks) / 2, g["dp"], cluster)
    return t


def _a2a_overlapped_s(model: ModelSpec, layout: Layout, load: StageLoad, a2a: float) -> float:
    """What the expert all-to-alls of one micro-batch add under Megatron-Core's 1F1B A2A overlap
    (`--overlap-moe-expert-parallel-comm`): one micro-batch's forward and another's backward run interleaved
    layer by layer, each all-to-all beside the other's computation that does not depend on it — the backward
    combine beside the forward attention, the forward dispatch beside the backward experts, the backward
    dispatch beside the forward experts, the forward combine beside the backward attention (Megatron-LM's
    combined_1f1b schedule) — so each pair takes the longer of the two, and an all-to-all paired with a short
    attention shows; the computation beside an all-to-all runs on the SMs its kernels leave (`_behind`)."""
    blocks = load.n_moe_blocks
    forward = load.compute.forward_s / max(load.n_blocks, 1)
    share = _attention_share(model, layout)
    attn, mlp, call = share * forward, (1 - share) * forward, a2a / blocks / 4
    slow = load.ep_overlap_slowdown
    return blocks * sum(_behind(call, work, slow) for work in (attn, 2 * mlp, mlp, 2 * attn))


def _attention_share(model: ModelSpec, layout: Layout) -> float:
    """The attention's share of an MoE block's forward FLOPs on a rank (its linears and core, against the
    experts', a shared expert's and the router's)."""
    m = layout.micro_batch_size * model.seq_length / layout.sp
    experts = moe.placement(model, layout)
    linears = block_linears(model, m, layout.tp, True, layout.ep, experts=experts)
    n_attention = len(linears) - (4 if model.shared_expert_ffn_hidden_size else 2)
    flops = [x.m * x.k * x.n for x in linears]
    core = m * model.seq_length * model.n_heads / layout.tp * (model.head_dim + model.v_width) / 2
    attention = sum(flops[:n_attention]) + core
    return attention / (sum(flops) + core)


def skips_down_projection(model: ModelSpec, layout: Layout) -> bool:
    """Whether full recomputation in this layout leaves each dense block's down projection out: the
    runtime's checkpoint stops early (Layout.recompute_stops_early) and nothing after that GEMM saves a tensor
    (toolkit.plan.cost.compute.early_stop_skips)."""
    return layout.recompute_stops_early and early_stop_skips(
        model, layout.lora, layout.fp8_recipe, layout.fused_kernels
    )


def _tp_comm_s(model: ModelSpec, cluster: ClusterSpec, layout: Layout, load: StageLoad, e: int) -> float:
    """Tensor-parallel all-reduces of one micro-batch on one rank (4 per block, 6 with full recomputation, 5
    when the checkpoint stops before the down projection, whose all-reduce follows its GEMM; with sequence
    parallelism the same bytes as reduce-scatter + all-gather pairs)."""
    if layout.tp == 1:
        return 0.0
    tokens = layout.micro_batch_size * model.seq_length / layout.sp
    rebuilt = load.n_blocks // (layout.recompute_every or 1) if layout.recompute == "full" else 0
    stops = skips_down_projection(model, layout)
    dense_share = (load.n_blocks - load.n_moe_blocks) / max(load.n_blocks, 1)  # as stage_compute shares it
    calls = 4 * load.n_blocks + 2 * rebuilt - (rebuilt * dense_share if stops else 0)
    if layout.etp is not None and not model.shared_expert_ffn_hidden_size:
        # Megatron-Core's MoE block dispatches its sequence-parallel tokens itself: only attention's pair of
        # TP collectives remains (a shared expert, a TP-split MLP, keeps its own)
        calls -= load.n_moe_blocks * (2 + (1 if rebuilt else 0))
    return calls * comm.all_reduce_s(tokens * model.hidden_size * e, _groups(layout, cluster)["tp"], cluster)


def sp_all_to_all_bytes(model: ModelSpec, layout: Layout, n_blocks: int, e: int) -> float:
    """Bytes one rank hands DeepSpeed-Ulysses' all-to-alls per micro-batch: in each block's attention, q, k and
    v (sequence → head sharded) and the output (back), a·d + 2·kv·d + a·d wide over its s/sp tokens; the same
    again for their gradients in backward, and once more when full recomputation reruns the forward."""
    if layout.sp == 1:
        return 0.0
    tokens = layout.micro_batch_size * model.seq_length / layout.sp
    widths = model.n_heads * (model.head_dim + model.v_width) + model.n_kv_heads * (
        model.head_dim + model.v_width
    )
    passes = 3 if layout.recompute == "full" else 2
    return passes * n_blocks * tokens * widths * e / layout.tp


def _gather_calls(model: ModelSpec, load: StageLoad, params: float, knobs: ZeroKnobs) -> float:
    """ZeRO-3 all-gathers per pass: one per module that owns parameters, coalesced up to the prefetch bucket."""
    if model.trace is not None:  # the modules that own parameters, as the trace counted them
        dense, moe = model.trace.kind(False), model.trace.kind(True)
        per_block = moe.param_modules if load.n_moe_blocks else dense.param_modules
    else:
        per_block = model.family.linears_per_block + (2 if load.n_moe_blocks else 0)
    return max(load.n_blocks * per_block, params / max(knobs.stage3_prefetch_bucket_size, 1))


def _dp_exposed_s(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, load: StageLoad, e: int, knobs: ZeroKnobs
) -> float:
    """Data-parallel traffic per step that is not hidden behind compute (see module docstring)."""
    g = _groups(layout, cluster)
    m = layout.gradient_accumulation_steps
    # BF16_Optimizer (pipeline + 16-bit at stage 0) all-reduces its fp32 gradient accumulator
    fp32_grads = layout.precision == "fp32" or (layout.zero_stage == 0 and layout.pp > 1)
    grad_e = 4 if fp32_grads else 2
    fwd, bwd = load.compute.forward_s, load.compute.backward_s + load.compute.recompute_s
    slow = load.overlap_slowdown
    if cluster.accelerator == "cpu":
        fwd = bwd = 0.0  # on the CPU accelerator the same cores run gloo and the math: nothing overlaps
    tail = exposed = 0.0
    for params, grp in ((load.dense_params, g["dp"]), (load.expert_params, g["edp"])):
        if grp.size <= 1 or params <= 0:
            continue
        buckets = max(1.0, params / knobs.reduce_bucket_size)
        if layout.zero_stage in (1, 2):
            reduce_one = comm.all_reduce_s(params * grad_e, grp, cluster, calls=buckets)
        else:
            reduce_one = comm.reduce_scatter_s(params * grad_e, grp, cluster, calls=buckets)
        gathers = _gather_calls(model, load, params, knobs)
        tail = max(tail, comm.all_reduce_s(min(knobs.reduce_bucket_size, params) * grad_e, grp, cluster))
        if layout.fsdp is not None:
            exposed += m * _fsdp_exposed_s(params, grp, cluster, layout, load, e, fwd, bwd)
        elif layout.optimizer != "adamw":
            exposed += _onebit_allreduce_s(params, grp, cluster, layout)
        elif layout.zero_stage == 0:
            # the engine's buffered all-reduce after backward, in 5e8-element buffers (engine.py)
            exposed += comm.all_reduce_s(params * grad_e, grp, cluster, calls=max(1.0, params / 5e8))
        elif layout.zero_stage in (1, 2):
            # updated partitions are all-gathered in place into the flat 16-bit model, bucket by bucket; with
            # Megatron's --overlap-param-gather each bucket is gathered behind the next forward
            gather = comm.all_gather_s(
                params * e, grp, cluster, calls=max(1.0, params / knobs.allgather_bucket_size)
            )
            gather = _behind(gather, fwd, slow) if layout.comm_overlap else gather
            exposed += (m if layout.zero_stage == 2 else 1) * _behind(reduce_one, bwd, slow) + gather
        elif layout.zeropp:
            # ZeRO++ (Wang et al. 2023): int8 weights forward (+ fp32 scale per 2048 values), backward gathers
            # from the secondary partition inside the node, int4 gradients reduce-scattered
            # the secondary partition the config sets (integrations/ds_config.py): the node's data-parallel ranks
            hpz_size = max(1, min(layout.dp, cluster.gpus_per_node // (layout.tp * layout.sp)))
            hpz = comm.group(hpz_size, layout.tp * layout.sp, cluster)
            gather_fwd = comm.all_gather_s(params * (1 + 4 / 2048), grp, cluster, calls=gathers)
            gather_bwd = comm.all_gather_s(params * e, hpz, cluster, calls=gathers)
            reduce_q = comm.reduce_scatter_s(params * (0.5 + 4 / 2048), grp, cluster, calls=buckets)
            exposed += m * (_behind(gather_fwd, fwd, slow) + _behind(gather_bwd + reduce_q, bwd, slow))
        else:
            gather = comm.all_gather_s(params * e, grp, cluster, calls=gathers)
            exposed += m * (_behind(gather, fwd, slow) + _behind(gather + reduce_one, bwd, slow))
    return exposed + (tail if layout.zero_stage and layout.fsdp is None else 0.0)


def _fsdp_exposed_s(
    params: float,
    grp: comm.Group,
    cluster: ClusterSpec,
    layout: Layout,
    load: StageLoad,
    e: int,
    fwd: float,
    bwd: float,
) -> float:
    """PyTorch FSDP's data-parallel traffic of one micro-batch that compute does not hide.

    FSDP wraps each block (llm-foundry's `fsdp_wrap_fn`, torchtitan's `fully_shard` per TransformerBlock,
    fms-fsdp's LLaMABlock policy) plus the root (embedding, final norm, head): one flat parameter per unit,
    all-gathered in one NCCL call and, in backward, reduce-scatter in one call (FSDP1 `FlatParameter`; FSDP2
    `FSDPParamGroup`). Forward issues unit i+1's all-gather on its own stream while unit i computes (implicit
    prefetch; "the 1st all-gather will not be able to overlap with anything", PyTorch's FSDP notes), backward
    prefetches the next unit's gather (BACKWARD_PRE, FSDP2's reverse post-forward order) and reduce-scatters
    each unit's gradients as they are produced, so only the first gather and the last reduce-scatter are
    exposed, plus whatever the rest does not fit in the compute beside it. FULL_SHARD (ZeRO-3) gathers again
    in backward; SHARD_GRAD_OP (ZeRO-2) keeps the gathered parameters until backward ends. Gradients are
    reduced in `layout.fsdp`'s dtype (MixedPrecision.reduce_dtype: fp32 for llm-foundry's `DEFAULT` and
    torchtitan, bf16 for fms-fsdp's `bfSixteen`). FSDP has no post-step gather: the optimizer updates the
    local shard in place. With `fsdp_backward_prefetch` "post" (BACKWARD_POST) a backward gather is issued only
    after the computation it could have overlapped, and the computation after it waits for it: all of
    FULL_SHARD's backward gathers are exposed and the reduce-scatters overlap what compute remains."""
    units = load.n_blocks + 1
    grad_e = 4 if layout.fsdp == "fp32" else 2
    gather = comm.all_gather_s(params * e, grp, cluster, calls=units)
    reduce = comm.reduce_scatter_s(params * grad_e, grp, cluster, calls=units)
    gather_one, reduce_one = gather / units, reduce / units
    backward_gather = gather if layout.zero_stage == 3 else 0.0
    slow = load.overlap_slowdown
    forward = gather_one + _behind(gather - gather_one, fwd, slow) + reduce_one
    if layout.fsdp_backward_prefetch == "post":
        return forward + backward_gather + _behind(reduce - reduce_one, bwd, slow)
    return forward + _behind(backward_gather + reduce - reduce_one, bwd, slow)


def _onebit_allreduce_s(params: float, grp: comm.Group, cluster: ClusterSpec, layout: Layout) -> float:
    """1-bit Adam / 0/1 Adam after warm-up: signs (1 bit) plus one fp32 scale per 2048 values, compressed
    twice (worker and server side; Tang et al. 2021 §4.2): 2(W-1)/W · n · (1/8 + 4/2048) bytes per rank, the
    ring all-reduce shape — 1/16 of the fp16 volume (1.6 % more for the scales), 1/32 of fp32."""
    return comm.all_reduce_s(params * (1 / 8 + 4 / 2048), grp, cluster)


def _optimizer_s(cluster: ClusterSpec, layout: Layout, load: StageLoad) -> tuple[float, float]:
    """(optimizer step seconds, exposed offload transfer seconds)."""
    shard = load.dense_params / (layout.zero_dp if layout.zero_stage else 1)
    shard += load.expert_params / (layout.expert_zero_dp if layout.zero_stage else 1)
    table = UNFUSED_ADAM_BYTES_PER_PARAM if cluster.accelerator == "cpu" else ADAM_BYTES_PER_PARAM
    per_param = table["fp32" if layout.precision == "fp32" else "mixed"]
    pcie = cluster.pcie_gb_per_s * 1e9
    grad_e = layout.bytes_per_element
    param_e = grad_e
    if layout.offload_optimizer == "none":
        path = "partitioned" if layout.zero_stage else "replicated"
        measured = (cluster.optimizer_ns_per_param or {}).get(path)
        if measured is not None and layout.optimizer == "adamw" and layout.precision != "fp32":
            return shard * measured * 1e-9, 0.0
        return shard * per_param / (cluster.gpu_memory_gb_per_s * 1e9), 0.0
    # CPU Adam: all ranks of a node share its DRAM bandwidth (ZeRO-Offload, Ren et al. 2021, §4.2)
    cpu_step = cluster.gpus_per_node * shard * per_param / (cluster.cpu_memory_gb_per_s * 1e9)
    transfers = shard * (grad_e + param_e) / pcie
    if layout.offload_optimizer == "nvme":
        # ZeRO-Infinity's step, sub-group by sub-group: read fp32 master, m, v and the gradient (16 B), Adam on
        # the CPU, write master, m and v back (12 B); the backward wrote the fp32 gradient (4 B). Without
        # `pipeline_read`/`pipeline_write` (DeepSpeed's default, and dstk's config) the swapper waits for each
        # read and write (partitioned_optimizer_swapper.py:106, 183), so I/O and the CPU step add up.
        io = NVME_OPTIMIZER_BYTES_PER_PARAM * shard * cluster.gpus_per_node / (cluster.nvme_gb_per_s * 1e9)
        cpu_step += io
    return cpu_step, transfers


def _param_offload_s(cluster: ClusterSpec, layout: Layout, load: StageLoad, e: int) -> float:
    """Exposed parameter fetches of ZeRO-Infinity: each micro-batch brings the partition in twice (forward
    and backward); prefetching hides it behind compute up to the compute time."""
    if layout.offload_param == "none":
        return 0.0
    shard = load.dense_params / layout.zero_dp + load.expert_params / layout.expert_zero_dp
    if layout.offload_param == "cpu":
        fetch = 2 * shard * e / (cluster.pcie_gb_per_s * 1e9)
        return layout.gradient_accumulation_steps * max(0.0, fetch - load.compute.total_s)
    nvme = cluster.nvme_gb_per_s * 1e9 / cluster.gpus_per_node
    fetch = 2 * shard * e / nvme
    # after the step the updated 16-bit partitions are written back to their swap files (stage3.py:1271-1290)
    return layout.gradient_accumulation_steps * max(0.0, fetch - load.compute.total_s) + shard * e / nvme


def _activation_offload_s(model: ModelSpec, cluster: ClusterSpec, layout: Layout, load: StageLoad) -> float:
    """Exposed copies of offloaded activation checkpoints: each block input goes to the host in forward and
    back in backward over the GPU's PCIe link, overlapped with compute as far as it lasts (ZeRO-Infinity §5.1.3:
    a few GB/s suffice to hide them)."""
    if not layout.offload_activations:
        return 0.0
    # a block input: what full recomputation keeps per block (activations.block_bytes), split over SP
    stored = act.block_bytes(
        model,
        layout.micro_batch_size,
        layout.bytes_per_element,
        layout.tp,
        layout.tp_sequence_parallel,
        "full",
    )
    copies = 2 * load.n_blocks * stored / layout.sp / (cluster.pcie_gb_per_s * 1e9)
    return layout.gradient_accumulation_steps * max(0.0, copies - load.compute.total_s)


def step_time(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, load: StageLoad, knobs: ZeroKnobs
) -> StepTime:
    """Seconds per optimizer step of `layout`, with `load` the slowest pipeline stage's work."""
    e = layout.bytes_per_element
    m, p = layout.gradient_accumulation_steps, layout.pp
    micro_comm = _micro_comm_s(model, cluster, layout, load, e)
    if layout.ep_comm_overlap and load.n_moe_blocks:
        a2a = moe.moe_comm_s(model, cluster, layout, load.n_moe_blocks, e)
        micro_comm = micro_comm - a2a + _a2a_overlapped_s(model, layout, load, a2a)
    if layout.comm_overlap and layout.tp > 1:
        # TE userbuffers: each TP collective runs beside the GEMM it feeds, so only what exceeds the micro-batch's
        # GEMM time shows (the pipeline sends and expert all-to-alls stay exposed)
        tp_part = _tp_comm_s(model, cluster, layout, load, e)
        micro_comm = micro_comm - tp_part + max(0.0, tp_part - load.compute.total_s)
    slot = load.compute.total_s + micro_comm
    opt, offload = _optimizer_s(cluster, layout, load)
    opt += cluster.step_overhead_ms * 1e-3
    return StepTime(
        compute_s=m * load.compute.total_s + load.compute.per_step_s,
        pipeline_bubble_s=(p - 1) * slot / layout.virtual_stages,
        model_parallel_comm_s=m * micro_comm,
        data_parallel_comm_s=_dp_exposed_s(model, cluster, layout, load, e, knobs),
        optimizer_s=opt,
        offload_s=offload
        + _param_offload_s(cluster, layout, load, e)
        + _activation_offload_s(model, cluster, layout, load),
    )
