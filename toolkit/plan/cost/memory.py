"""Memory per rank: model states as the DeepSpeed engine really holds them, activations, buffers, overhead.

Two views of model states are computed:
- the ZeRO paper's convention (Rajbhandari et al. 2020, §5, Fig. 1): 2Ψ params + 2Ψ gradients + KΨ optimizer
  states with K = 12 for mixed precision (K = 8 and 4-byte params/gradients for fp32), each divided by N_d
  from the stage that partitions it (`Memory.zero_paper`, to compare with the paper; never printed);
- the engine's inventory, read from DeepSpeed 0.19.8's optimizer classes (and checked tensor by tensor on 2
  ranks): stage 0 in 16-bit is `FP16_UnfusedOptimizer` with a full fp32 master copy (14Ψ + 2Ψ gradients);
  stages 1/2 keep the whole 16-bit (or fp32) flat model, padded to a multiple of 2·N_d, plus a cloned fp32
  partition, m and v (b·F + 12·F/N_d) and a gradient partition; stage 3 keeps b·S + 4·S (a separate fp32
  master even in fp32) + 8·S (m, v) + b·S (gradient partitions), S = Ψ/N_d, plus its reduce bucket and the
  small parameters it never re-partitions (`stage3_param_persistence_threshold`).
`total` uses the engine's inventory: it is what the accelerator must hold. It is the peak of two moments:
backward, with the model states, activations and buffers live, and the optimizer step, where activations and
buffers are gone and the step's transient (fp32 gradient copies, Adam's temporaries) stands beside the model
states. `Memory.parts()` splits it into parts that add up to it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.plan.layout import BYTES_PER_ELEMENT, Layout
from toolkit.plan.params import ParamCount
from toolkit.plan.specs import ClusterSpec
from toolkit.plan.units import GIB
from toolkit.plan.zero_knobs import OPTIMIZER_SWAP_BUFFERS, PARAM_SWAP_BUFFERS, ZeroKnobs

HOST_USABLE = 0.9
"""Share of a node's host memory offloaded states and checkpoint snapshots may take: the OS, the ranks' own
processes and page cache need the rest."""


@dataclass(frozen=True)
class RankParams:
    """Parameters one rank of one pipeline stage owns before ZeRO partitioning."""

    dense: float
    """Non-expert parameters (sharded by ZeRO over the data-parallel group)."""
    dense_convention: float
    """`dense` with the TP-replicated pieces (norms, row biases, routers, positions) also divided by TP: the
    Ψ/(t·p) of the ZeRO-paper convention, so that convention's figures never grow with TP."""
    expert: float
    """Expert parameters (sharded by ZeRO over the expert-data-parallel group)."""
    persistent: float
    """Small tensors ZeRO-3 keeps gathered (norms, biases, small routers)."""
    largest_module: float
    """Largest single module ZeRO-3 must gather at once (a matrix, a fused q/k/v or the embedding)."""


@dataclass(frozen=True)
class EngineStates:
    """Bytes of model states on one rank (accelerator) and on its host, as the engine allocates them."""

    low_precision_params: float
    master_params: float
    optimizer_moments: float
    gradients: float
    host_bytes: float
    """Offloaded states in host memory, for this rank."""
    nvme_bytes: float
    step_transient: float
    """Bytes above `device_bytes` that exist only inside `optimizer.step()`: fp32 gradient copies, and on the
    CPU accelerator the temporaries of torch's AdamW (see :func:`adam_temporaries`)."""

    @property
    def device_bytes(self) -> float:
        return self.low_precision_params + self.master_params + self.optimizer_moments + self.gradients


@dataclass(frozen=True)
class PaperStates:
    """Model states per rank in the ZeRO paper's convention (Rajbhandari et al. 2020, Fig. 1), before offload
    is taken off: what the paper's figures compare with, not what the engine allocates."""

    params: float
    gradients: float
    optimizer_states: float

    @property
    def total(self) -> float:
        return self.params + self.gradients + self.optimizer_states


@dataclass(frozen=True)
class Memory:
    """Peak bytes per rank of the most loaded pipeline stage, and host/NVMe bytes per node."""

    zero_paper: PaperStates
    activations: float
    buffers: float
    engine: EngineStates
    framework_overhead: float
    cpu_per_node: float
    nvme_per_node: float
    rank: RankParams
    """The parameters this stage's rank owns before ZeRO (dense and expert)."""
    host_swap: float = 0.0
    """Pinned NVMe parameter swap buffers on the host, per rank (in `cpu_per_node`)."""
    host_activations: float = 0.0
    """Checkpointed block inputs offloaded to host memory, per rank (in `cpu_per_node`)."""
    fp8_weight_copies: float = 0.0
    """FP8 copies of the linear weights Transformer Engine keeps from step to step (toolkit/plan/cost/fp8.py)."""

    @property
    def total(self) -> float:
        busy = self.activations + self.buffers
        held = self.engine.device_bytes + self.fp8_weight_copies
        return held + max(busy, self.engine.step_transient) + self.framework_overhead

    @property
    def step_transient_excess(self) -> float:
        """What the optimizer step adds above the backward moment's activations and buffers (0 when backward
        is the peak)."""
        return max(0.0, self.engine.step_transient - self.activations - self.buffers)

    @property
    def peak_phase(self) -> str:
        """The moment the peak falls in: "backward" or "optimizer step"."""
        return "optimizer step" if self.step_transient_excess > 0 else "backward"

    def parts(self) -> dict[str, float]:
        """`total` as parts that add up to it: the engine's model states (the 16-bit or fp32 working
        parameters, their gradients, the optimizer's fp32 master copy and moments), the activations and buffers
        of backward, the framework's fixed overhead, and the optimizer step's transient above the activations
        and buffers it outlives, and in fp8 under Transformer Engine the FP8 weight copies. The keys are
        `dstk estimate --json`'s `memory_per_gpu_bytes`."""
        e = self.engine
        return {
            "params": e.low_precision_params,
            "fp8_weight_copies": self.fp8_weight_copies,
            "gradients": e.gradients,
            "optimizer_states": e.master_params + e.optimizer_moments,
            "activations": self.activations,
            "buffers": self.buffers,
            "framework_overhead": self.framework_overhead,
            "step_transient_excess": self.step_transient_excess,
        }


def zero_paper_states(psi: float, n: float, stage: int, precision: str) -> tuple[float, float, float]:
    """(params, gradients, optimizer states) bytes per rank, ZeRO paper convention (K = 12 mixed, 8 fp32)."""
    b = BYTES_PER_ELEMENT[precision]
    k = 8 if b == 4 else 12
    return (
        b * psi / (n if stage >= 3 else 1),
        b * psi / (n if stage >= 2 else 1),
        k * psi / (n if stage >= 1 else 1),
    )


def adam_temporaries(layout: Layout, accelerator: str) -> float:
    """Bytes per element that the optimizer allocates beside the fp32 tensor it updates, inside `step()`.

    dstk's configs select DeepSpeed's FusedAdam (CUDA: one in-place multi-tensor kernel, no temporaries) or,
    on the CPU accelerator, `torch_adam` — torch.optim.AdamW, whose default there is the single-tensor path
    (torch 2.x `_default_to_fused_or_foreach` offers foreach only to CUDA/XPU/MTIA tensors). That path computes
    `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`: two fp32 temporaries of the tensor's size
    alive at once, 8 B per element. On a ZeRO-1/2/3 flat partition that is 8 B per shard parameter; measured on
    2 CPU ranks by benchmarks/step_memory.py (63M GPT-2, bf16, peak RSS inside the step with large blocks
    mmapped): the ZeRO-1, -2 and -3 steps all rise 12.0 B per shard parameter above the RSS after the step
    (fp32 gradient 4 + Adam 8). The offload paths
    use DeepSpeedCPUAdam (in place); dstk's 1-bit optimizers are not modelled here.
    """
    if accelerator != "cpu" or layout.optimizer != "adamw" or layout.offload_optimizer != "none":
        return 0.0
    return 8.0


def engine_states(
    psi: float,
    n: int,
    layout: Layout,
    knobs: ZeroKnobs,
    persistent: float,
    largest_param: float,
    grad_partition: float | None = None,
    adam_temp: float = 0.0,
) -> EngineStates:
    """What DeepSpeed 0.19.8 allocates for `psi` parameters sharded over `n` ranks (one parameter group).

    `grad_partition`: the exact ZeRO-1/2 gradient buffer of the most loaded rank (every tensor its range
    touches, in full; :func:`toolkit.plan.params.zero_grad_partition`) when the tensor list is known, else the
    even share. `adam_temp`: :func:`adam_temporaries`, bytes per element of the tensor Adam updates at once.
    """
    b = layout.bytes_per_element
    # ZeRO-1/2/3's step flattens its gradients and casts them to fp32 (`.to` is a no-op on fp32): bytes per
    # element while both exist, then the fp32 gradient beside Adam's temporaries
    cast, update = b + (4 if b == 2 else 0), 4 + adam_temp
    stage, gas = layout.zero_stage, layout.gradient_accumulation_steps
    off_opt, off_param = layout.offload_optimizer != "none", layout.offload_param != "none"
    if psi <= 0:
        return EngineStates(0, 0, 0, 0, 0, 0, 0)
    if stage == 0 and b == 2 and layout.pp > 1:
        # pipeline + 16-bit at stage 0 selects BF16_Optimizer (engine._do_optimizer_sanity_check): a padded
        # flat 16-bit model, a full fp32 gradient accumulator, and fp32 master/m/v partitioned over DP
        flat = math.ceil(psi / (2 * n)) * 2 * n
        part = flat / n
        return EngineStates(b * flat, 4 * part, 8 * part, 4 * flat + b * psi, 0, 0, 0)
    if stage == 0:
        # 16-bit: FP16_UnfusedOptimizer keeps a full fp32 copy and casts every gradient to fp32 before the
        # step; the optimizer then updates one tensor at a time (its temporaries: the largest tensor's)
        master = 0.0 if b == 4 else 4 * psi
        transient = master + adam_temp * min(psi, largest_param)
        return EngineStates(b * psi, master, 8 * psi, b * psi, 0, 0, transient)
    if stage in (1, 2):
        flat = math.ceil(psi / (2 * n)) * 2 * n
        part = flat / n
        if off_opt:
            host = (16 + b) * part + b * largest_param + (b * part if gas > 1 else 0)
            return EngineStates(b * flat, 0, 0, b * largest_param, host, 0, 0)
        held = grad_partition if grad_partition is not None else part
        # ZeRO-1 keeps whole gradients during accumulation. ZeRO-2 reduces every micro-step and copies its
        # share into the one `grads_in_partition` buffer, which autograd then accumulates into in place
        # (stage_1_and_2.py copy_grads_in_partition): one partition at any accumulation (measured at 4
        # micro-steps, bf16: the engine's largest holding over the step equals the GA = 1 figure).
        grads = b * psi if (stage == 1 and gas > 1) else b * held
        # step(): ZeRO-1 first frees the gradients outside its partition; the partition's stay beside the
        # cast and the update of the flat partition
        in_step = b * held + max(cast, update) * part
        return EngineStates(b * flat, 4 * part, 8 * part, grads, 0, 0, in_step - grads)
    shard = psi / n
    # small parameters below the persistence threshold stay gathered beside their partition, on the device
    lp = (0.0 if off_param else b * shard) + b * persistent
    # offloaded 16-bit parameters: pinned host copies, or NVMe files but for what `max_in_cpu` keeps in host
    in_cpu = shard if layout.offload_param == "cpu" else min(shard, knobs.nvme_max_in_cpu)
    param_host = b * in_cpu if off_param else 0.0
    param_nvme = b * (shard - in_cpu) if layout.offload_param == "nvme" else 0.0
    if not off_opt:
        # the cast and the update run per sub-group
        transient = max(cast, update) * min(shard, knobs.sub_group_size)
        return EngineStates(lp, 4 * shard, 8 * shard, b * shard, param_host, param_nvme, transient)
    # an offloading ZeRO-3 optimizer keeps every gradient partition in one pinned host buffer of the gradient
    # accumulation dtype (the model's unless set; stage3.py:791-795), also when its states are on NVMe
    host = b * shard + param_host
    nvme = param_nvme
    if layout.offload_optimizer == "nvme":
        # fp32 master, m, v and the fp32 gradient in swap files, 16 B per element (optimizer_utils.py,
        # partitioned_optimizer_swapper.py); in host memory only the pinned swap buffers of one sub-group each
        nvme += 16 * shard
        host += OPTIMIZER_SWAP_BUFFERS * 4 * min(shard, knobs.sub_group_size)
    else:
        host += 16 * shard
    return EngineStates(lp, 0, 0, 0, host, nvme, 0)


def nvme_param_swap_bytes(layout: Layout, knobs: ZeroKnobs, rank: RankParams, b: int) -> float:
    """Pinned host bytes of NVMe parameter offload besides the parameters themselves, per rank: the swap
    buffer pool (`buffer_count` × `buffer_size`, partitioned_param_swapper.py:124-131), and — when a
    sub-group stays on NVMe — the write-back buffer of the largest sub-group, which DeepSpeed 0.19.8 sizes
    from its tensors' full `ds_numel` although only their partitions are written (stage3.py:1007-1018), i.e.
    up to W × the sub-group."""
    if layout.offload_param != "nvme":
        return 0.0
    pool = PARAM_SWAP_BUFFERS * b * knobs.nvme_param_buffer_size
    shard = rank.dense / layout.zero_dp + rank.expert / layout.expert_zero_dp
    if shard <= knobs.nvme_max_in_cpu:
        return pool
    write_back = min(knobs.sub_group_size * layout.zero_dp, rank.dense + rank.expert)
    return pool + b * write_back


def _sum_states(a: EngineStates, b: EngineStates) -> EngineStates:
    """Two parameter groups' states. The optimizer steps the groups one after the other (stage_1_and_2 and
    stage3 free each group's fp32 gradient before the next), so their step transients do not add up."""
    total = {k: getattr(a, k) + getattr(b, k) for k in a.__dict__}
    return EngineStates(**{**total, "step_transient": max(a.step_transient, b.step_transient)})


def zero_buffers(
    layout: Layout, knobs: ZeroKnobs, rank: RankParams, b: int, hpz_size: int = 1, accelerator: str = "cuda"
) -> float:
    """Reduce buckets and ZeRO-3's gathered-parameter working set, bytes.

    ZeRO-1/2 allocate `reduce_bucket_size` elements (twice with overlap_comm) during backward: a CUDA caching
    allocator reserves them whole; on the CPU accelerator only written pages exist and they are released after
    the step, before the next peak (measured: 5e8-element and h²-element buckets give the same peak RSS).
    ZeRO-3 keeps one bucket for the whole run (on CPU, resident as far as gradients were copied through it:
    at most the model), the parameters it keeps gathered — at least the
    module being computed plus the prefetch, at most `stage3_max_live_parameters` or the whole stage (with
    DeepSpeed's default 1e9 a small model stays gathered from forward into backward, measured) — and the
    current module's full gradient. ZeRO++'s hpZ adds a secondary copy of the weights over a node's ranks.
    """
    if layout.zero_stage == 0:
        return 0.0
    if layout.zero_stage in (1, 2):
        return (
            0.0 if accelerator == "cpu" else knobs.reduce_bucket_size * b * (2 if knobs.overlap_comm else 1)
        )
    full = rank.dense + rank.expert
    bucket = min(knobs.reduce_bucket_size, full) if accelerator == "cpu" else knobs.reduce_bucket_size
    prefetch = min(knobs.stage3_prefetch_bucket_size, knobs.stage3_max_live_parameters)
    gathered = min(full, max(knobs.stage3_max_live_parameters, rank.largest_module + prefetch))
    secondary = b * (rank.dense / hpz_size + rank.expert / layout.expert_zero_dp) if layout.zeropp else 0.0
    return b * (bucket + gathered + rank.largest_module) + secondary


def rank_params(
    pc: ParamCount,
    layout: Layout,
    blocks: int,
    moe_blocks: int,
    first: bool,
    last: bool,
    persistence_threshold: int,
) -> RankParams:
    """Split a stage's parameters over TP (matrices and their column biases), EP (experts), replicas (norms,
    row biases, routers, positions); the tied embedding lives on both the first and the last stage."""
    t, ep = layout.tp, layout.ep
    common = (
        (pc.attention_weights + pc.attention_sharded_bias) / t
        + pc.attention_replicated_weights
        + pc.attention_replicated_bias
        + pc.block_norms
    )
    dense_mlp = (pc.mlp_weights + pc.mlp_sharded_bias) / t + pc.mlp_replicated_bias
    dense_blocks = blocks - moe_blocks
    dense = blocks * common + dense_blocks * dense_mlp + moe_blocks * (pc.router + pc.shared_expert / t)
    expert = moe_blocks * pc.num_experts / ep * pc.expert / (layout.etp or 1)  # ETP splits each expert
    # Megatron splits the word embedding over TP (VocabParallelEmbedding); DeepSpeed AutoTP keeps it whole and
    # splits only an untied LM head (measured: a 2-way AutoTP Llama holds the full embedding, half the head)
    word = pc.word_embedding / t if layout.tp_vocab_parallel else pc.word_embedding
    edge = 0.0
    if first:
        dense += word + pc.position_embedding + pc.embedding_norm
        edge += pc.word_embedding / t + (pc.position_embedding + pc.embedding_norm) / t
    if last:
        head = pc.lm_head / t if pc.lm_head else (word if layout.pp > 1 else 0)
        dense += pc.final_norm + head
        edge += pc.final_norm / t + head
    convention = (
        blocks * (pc.block_common / t)
        + dense_blocks * pc.dense_mlp / t
        + moe_blocks * (pc.router + pc.shared_expert) / t
        + edge
    )
    small = pc.block_norms + pc.attention_replicated_bias + pc.mlp_replicated_bias
    small += (pc.attention_sharded_bias + pc.mlp_sharded_bias) / t
    persistent = blocks * small + (moe_blocks * pc.router if pc.router <= persistence_threshold else 0)
    if last:
        persistent += pc.final_norm
    expert_leaf = pc.largest_expert_leaf / (ep if pc.fused_experts else 1) if moe_blocks else 0.0
    largest = max(pc.largest_dense_leaf / t, expert_leaf) if blocks else 0.0
    if first or (last and (pc.lm_head or layout.pp > 1)):
        largest = max(largest, word)
    return RankParams(
        dense=dense, dense_convention=convention, expert=expert, persistent=persistent, largest_module=largest
    )


def _hpz(cluster: ClusterSpec, layout: Layout) -> int:
    return max(1, min(layout.dp, cluster.gpus_per_node // (layout.tp * layout.sp)))


def stage_memory(
    layout: Layout,
    cluster: ClusterSpec,
    knobs: ZeroKnobs,
    rank: RankParams,
    activations: float,
    largest_param: float,
    grad_partition: float | None = None,
    trainable: float | None = None,
    host_activations: float = 0.0,
    fp8_weight_copies: float = 0.0,
) -> Memory:
    """Peak memory of one rank of a stage that owns `rank` parameters and keeps `activations` bytes.

    `trainable`: with LoRA, the adapter parameters on the rank. Only they get gradients, fp32 masters and
    moments (DeepSpeed builds its optimizer groups from parameters that require gradients); the frozen base
    is held in the training precision — partitioned at ZeRO-3, whose hooks gather every parameter."""
    stage = layout.zero_stage
    b = layout.bytes_per_element
    adam_temp = adam_temporaries(layout, cluster.accelerator)
    # ZeRO partitions over data- and sequence-parallel ranks (Layout.zero_dp)
    w, ew = layout.zero_dp, layout.expert_zero_dp
    if trainable is not None:
        engine = engine_states(trainable, w, layout, knobs, 0, trainable, adam_temp=adam_temp)
        frozen = b * (rank.dense + rank.expert) / (w if stage == 3 else 1)
        frozen += b * rank.persistent if stage == 3 else 0.0
        engine = EngineStates(
            **{**engine.__dict__, "low_precision_params": engine.low_precision_params + frozen}
        )
        paper = list(zero_paper_states(trainable, w, stage, layout.precision))
        paper[0] = b * (rank.dense_convention + rank.expert + trainable) / (w if stage == 3 else 1)
    else:
        dense = engine_states(
            rank.dense, w, layout, knobs, rank.persistent, largest_param, grad_partition, adam_temp
        )
        expert = engine_states(rank.expert, ew, layout, knobs, 0, largest_param, adam_temp=adam_temp)
        engine = _sum_states(dense, expert)
        paper = [
            x + y
            for x, y in zip(
                zero_paper_states(rank.dense_convention, w, stage, layout.precision),
                zero_paper_states(rank.expert, ew, stage, layout.precision),
                strict=True,
            )
        ]
    if layout.offload_optimizer != "none":
        paper[2] = 0.0
    if layout.offload_param != "none":
        paper[0] = 0.0
    swap = nvme_param_swap_bytes(layout, knobs, rank, b)
    return Memory(
        zero_paper=PaperStates(*paper),
        activations=activations,
        buffers=zero_buffers(layout, knobs, rank, b, _hpz(cluster, layout), cluster.accelerator),
        engine=engine,
        framework_overhead=cluster.framework_overhead_gib * GIB,
        cpu_per_node=(engine.host_bytes + swap + host_activations) * cluster.gpus_per_node,
        nvme_per_node=engine.nvme_bytes * cluster.gpus_per_node,
        rank=rank,
        host_swap=swap,
        host_activations=host_activations,
        fp8_weight_copies=fp8_weight_copies,
    )
