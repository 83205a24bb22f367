"""The cost model: memory per rank, step time, throughput and MFU of one layout. Pure; no torch import.

`estimate()` walks the pipeline stages (blocks spread evenly, embedding on the first stage, head on the
last), computes each stage's memory and per-micro-batch time, and reports the most loaded stage's memory and
the slowest stage's time. The formulas and their sources live in the modules this one combines:
:mod:`toolkit.plan.cost.memory` (ZeRO states as DeepSpeed allocates them), :mod:`toolkit.plan.cost.activations` (Korthikanti
et al. 2022), :mod:`toolkit.plan.cost.compute` (roofline GEMMs), :mod:`toolkit.plan.cost.timing` (communication and schedule),
:mod:`toolkit.plan.cost.flops` (PaLM's MFU convention).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from toolkit.plan.checkpoint_interval import CheckpointPlan, checkpoint_plan
from toolkit.plan.cost import activations as act
from toolkit.plan.cost.compute import block_linears, slowed_by_collectives, stage_compute
from toolkit.plan.cost.flops import hardware_flops_per_token, model_flops_per_token, model_tflops_per_gpu
from toolkit.plan.cost.fp8 import cast_transient_bytes, fp8_gemms, weight_copies_bytes
from toolkit.plan.cost.memory import GIB, HOST_USABLE, Memory, rank_params, stage_memory
from toolkit.plan.cost.moe import dispatcher_sms, placement
from toolkit.plan.cost.stages import Stage, candidate_stages, layout_stages, stage_blocks, with_mtp
from toolkit.plan.cost.timing import (
    StageLoad,
    StepTime,
    skips_down_projection,
    sp_all_to_all_bytes,
    step_time,
)
from toolkit.plan.layout import Layout, engine_precision
from toolkit.plan.params import count_params, tensor_numels, zero_grad_partition
from toolkit.plan.specs import ClusterSpec, ModelSpec
from toolkit.plan.units import as_bytes, format_bytes
from toolkit.plan.zero_knobs import ZeroKnobs, derive_zero_knobs


def host_fits(memory: Memory, cluster: ClusterSpec) -> bool:
    return memory.cpu_per_node <= HOST_USABLE * cluster.cpu_memory_gib * GIB


def host_need(memory: Memory, cluster: ClusterSpec) -> str:
    """The host memory a layout needs per node against what may be used, by part (for refusals)."""
    n = cluster.gpus_per_node
    states = memory.engine.host_bytes * n
    parts = [f"pinned gradient partitions and offloaded states {format_bytes(states, 1)}"]
    if memory.host_swap:
        parts.append(f"NVMe swap buffers {format_bytes(memory.host_swap * n, 1)}")
    if memory.host_activations:
        parts.append(f"activation checkpoints {format_bytes(memory.host_activations * n, 1)}")
    return (
        f"{format_bytes(memory.cpu_per_node, 1)} per node > {HOST_USABLE:.0%} of "
        f"{format_bytes(cluster.cpu_memory_gib * GIB, 1)} ({', '.join(parts)})"
    )


def nvme_fits(memory: Memory, cluster: ClusterSpec) -> bool:
    return memory.nvme_per_node <= cluster.nvme_gib * GIB


@dataclass(frozen=True)
class Estimate:
    """Everything `dstk estimate` reports for one (model, cluster, layout)."""

    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    knobs: ZeroKnobs
    memory: Memory
    time: StepTime

    @property
    def capacity_bytes(self) -> float:
        return self.cluster.gpu_memory_gib * GIB

    @property
    def fits_gpu(self) -> bool:
        return self.memory.total <= self.capacity_bytes

    @property
    def fits_cpu(self) -> bool:
        return host_fits(self.memory, self.cluster)

    @property
    def fits_nvme(self) -> bool:
        return nvme_fits(self.memory, self.cluster)

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_cpu and self.fits_nvme

    @property
    def tokens_per_step(self) -> int:
        return self.layout.global_batch_size * self.model.seq_length

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.time.total_s

    @property
    def model_flops_per_token(self) -> float:
        """Model FLOPs per token (:func:`toolkit.plan.cost.flops.model_flops_per_token`): what MFU counts."""
        return model_flops_per_token(self.model, self.layout.lora is not None)

    @property
    def hardware_flops_per_token(self) -> float:
        """Model FLOPs per token plus what this layout computes again (recomputation, expert padding)."""
        layout = self.layout
        return hardware_flops_per_token(
            self.model,
            layout.recompute,
            layout.lora is not None,
            layout.recompute_every or 1,
            skips_down_projection(self.model, layout),
            act.torchao_linears(layout.fp8_recipe, layout.fused_kernels),
            act.hf_modules(layout) and layout.ep == 1,
        )

    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per accelerator (PaLM convention, no recomputation)."""
        frozen = self.layout.lora is not None
        return model_tflops_per_gpu(self.model, self.tokens_per_s, self.layout.world_size, frozen)

    @property
    def hardware_tflops_per_gpu(self) -> float:
        """TFLOP/s per accelerator including recomputation (Megatron's reporting convention); never below
        `tflops_per_gpu`."""
        return self.hardware_flops_per_token * self.tokens_per_s / self.layout.world_size / 1e12

    @property
    def peak_flops(self) -> float:
        """The accelerator's peak FLOP/s in the layout's precision: the denominator of MFU."""
        return self.cluster.peak_flops(self.layout.precision)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model TFLOP/s per accelerator over its peak in the layout's precision."""
        return self.tflops_per_gpu * 1e12 / self.peak_flops

    def checkpoint_plan(self) -> CheckpointPlan:
        """The checkpoint scheme of this layout (toolkit.plan.checkpoint_interval): its snapshots must fit
        beside the host memory it takes — offloaded states, and on the CPU accelerator the ranks' whole memory,
        which is host memory too."""
        in_use = self.memory.cpu_per_node
        if self.cluster.accelerator == "cpu":
            in_use += self.memory.total * self.cluster.gpus_per_node
        before_update = self.time.total_s - self.time.optimizer_s - self.time.offload_s
        return checkpoint_plan(
            self.model, self.cluster, self.layout, self.time.total_s, in_use, max(0.0, before_update)
        )

    def host_parts(self) -> dict[str, float]:
        """Host memory per node by part: what offload takes (the `cpu_memory_per_node_bytes` the fit checks),
        and the snapshots asynchronous checkpoint saves (`dstk train --async-save`) would hold beside it."""
        m, n = self.memory, self.cluster.gpus_per_node
        ckpt = self.checkpoint_plan()
        return {
            "offloaded_states": m.engine.host_bytes * n,
            "nvme_swap_buffers": m.host_swap * n,
            "activation_checkpoints": m.host_activations * n,
            "checkpoint_snapshots": ckpt.snapshot_host_bytes if ckpt.asynchronous else 0.0,
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `dstk estimate --json` (documented in docs/guide.md: the fields other tools read, plus
        breakdowns). Memory is in whole bytes, and every block of parts adds up to its `total`; MFU is model
        FLOPs over the peak of the layout's precision (`peak_flops_per_gpu`)."""
        m, t = self.memory, self.time
        return {
            "model": self.model.name,
            **({"model_notes": list(self.model.trace.notes)} if self.model.trace is not None else {}),
            "cluster": self.cluster.name,
            "n_params": count_params(self.model).total,
            "n_active_params": count_params(self.model).active,
            "layout": self.layout.model_dump(),
            "memory_per_gpu_bytes": _with_total(m.parts()),
            "peak_phase": m.peak_phase,
            "step_transient_bytes": as_bytes(m.engine.step_transient),
            "engine_model_states_bytes": _with_total(
                {
                    "low_precision_params": m.engine.low_precision_params,
                    "master_params": m.engine.master_params,
                    "optimizer_moments": m.engine.optimizer_moments,
                    "gradients": m.engine.gradients,
                }
            ),
            "gpu_memory_bytes": as_bytes(self.capacity_bytes),
            # what the comms logger of a `dstk train --comms-logger` run records as all_to_all_single
            "sp_all_to_all_bytes_per_step": as_bytes(
                self.layout.gradient_accumulation_steps
                * sp_all_to_all_bytes(
                    self.model,
                    self.layout,
                    max(
                        b
                        for b, _ in stage_blocks(
                            self.model,
                            self.layout.pp,
                            self.layout.virtual_stages,
                            self.layout.pipeline_layout,
                        )
                    ),
                    self.layout.bytes_per_element,
                )
            ),
            "cpu_memory_per_node_bytes": as_bytes(m.cpu_per_node),
            "host_memory_per_node_bytes": _with_total(self.host_parts()),
            "nvme_per_node_bytes": as_bytes(m.nvme_per_node),
            "offload_per_rank_bytes": {
                "host_states": as_bytes(m.engine.host_bytes),
                "host_swap_buffers": as_bytes(m.host_swap),
                "host_activations": as_bytes(m.host_activations),
                "nvme": as_bytes(m.engine.nvme_bytes),
            },
            "fits": self.fits,
            "fits_gpu": self.fits_gpu,
            "fits_cpu": self.fits_cpu,
            "fits_nvme": self.fits_nvme,
            "step_time_s": t.total_s,
            "step_time_breakdown_s": {
                "compute": t.compute_s,
                "pipeline_bubble": t.pipeline_bubble_s,
                "model_parallel_comm": t.model_parallel_comm_s,
                "data_parallel_comm": t.data_parallel_comm_s,
                "optimizer": t.optimizer_s,
                "offload": t.offload_s,
            },
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "peak_flops_per_gpu": self.peak_flops,
            "model_flops_per_token": self.model_flops_per_token,
            "hardware_flops_per_token": self.hardware_flops_per_token,
            "zero_knobs": self.knobs.__dict__,
            "params_per_rank": {"dense": m.rank.dense, "expert": m.rank.expert},
        }


def _with_total(parts: dict[str, float]) -> dict[str, int]:
    """Parts in whole bytes, and their `total`: the sum of the rounded parts, so the JSON adds up exactly."""
    out = {k: as_bytes(v) for k, v in parts.items()}
    return {**out, "total": sum(out.values())}


def estimate_memory(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, knobs: ZeroKnobs | None = None
) -> Memory:
    """Peak memory per rank of the most loaded pipeline stage (the planner's cheap first filter)."""
    return max(
        _memories(model, cluster, layout, knobs, candidate_stages(model, layout)), key=lambda m: m.total
    )


def stage_memories(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, knobs: ZeroKnobs | None = None
) -> list[Memory]:
    """Peak memory per rank of every pipeline stage, first to last (earlier stages hold more micro-batches in
    flight under 1F1B); `estimate_memory` is the largest of these."""
    return _memories(model, cluster, layout, knobs, layout_stages(model, layout))


def _memories(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, knobs: ZeroKnobs | None, stages: list[Stage]
) -> list[Memory]:
    pc = count_params(model)
    knobs = knobs or derive_zero_knobs(model, layout)
    largest_param = _largest_param(pc, layout, model)
    out: list[Memory] = []
    for st in stages:
        blocks, moe_blocks = with_mtp(model, st)
        rank = rank_params(
            pc, layout, blocks, moe_blocks, st.embedding, st.head, knobs.stage3_param_persistence_threshold
        )
        per_micro = act.per_micro_activations(model, layout, blocks, moe_blocks)
        activations = act.stage_activations(model, layout, st.index, blocks, moe_blocks, per_micro, st.head)
        fp8_copies, fp8_transient = _fp8_memory(model, layout, st)
        activations += fp8_transient
        mem = stage_memory(
            layout,
            cluster,
            knobs,
            rank,
            activations,
            largest_param,
            _grad_partition(model, layout),
            trainable=_lora_params(model, layout, st.blocks),
            host_activations=act.host_activations(layout, st.index, per_micro),
            fp8_weight_copies=fp8_copies,
        )
        out.append(mem)
    return out


def _fp8_memory(model: ModelSpec, layout: Layout, st: Stage) -> tuple[float, float]:
    """(FP8 weight copies kept between micro-batches, eager cast temporaries) on a rank of stage `st`
    (toolkit/plan/cost/fp8.py); (0, 0) for a layout without FP8."""
    recipe = layout.fp8_recipe
    if recipe is None or not st.blocks:
        return 0.0, 0.0
    m = layout.micro_batch_size * model.seq_length / layout.sp
    copies = transient = 0.0
    for count, moe in ((st.blocks - st.moe_blocks, False), (st.moe_blocks, True)):
        if count:
            linears = block_linears(model, m, layout.tp, moe, layout.ep)
            copies += weight_copies_bytes(linears, count, recipe)
            transient = max(transient, cast_transient_bytes(linears, recipe, layout.fused_kernels))
    return copies, transient


def _lora_params(model: ModelSpec, layout: Layout, blocks: int) -> float | None:
    """LoRA adapter parameters on a rank of a stage with `blocks` blocks (None: full training)."""
    if layout.lora is None:
        return None
    from toolkit.plan.lora import adapter_params_per_block, parse_lora

    return float(blocks * adapter_params_per_block(model, parse_lora(layout.lora)))


def _grad_partition(model: ModelSpec, layout: Layout) -> int | None:
    """The exact ZeRO-1/2 gradient buffer when the whole model is one flat group on every rank (no TP, PP or
    expert groups), from the HF tensor order; otherwise None (the even share is used)."""
    if layout.zero_stage not in (1, 2) or layout.tp > 1 or layout.pp > 1 or model.is_moe:
        return None
    return zero_grad_partition(tensor_numels(model), layout.zero_dp)


def _largest_param(pc, layout: Layout, model: ModelSpec) -> float:
    if model.trace is not None:
        return max(pc.word_embedding, pc.largest_dense_leaf, pc.largest_expert_leaf / layout.ep)
    return max(pc.word_embedding / layout.tp, pc.mlp_weights / layout.tp / (3 if model.gated_mlp else 2))


def estimate(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, knobs: ZeroKnobs | None = None
) -> Estimate:
    """Memory and time of `layout`; memory of the most loaded stage, time of the slowest. `knobs`: the ZeRO
    sizes of the config (default: the ones dstk's generated config sets)."""
    pc = count_params(model)
    knobs = knobs or derive_zero_knobs(model, layout)
    e = layout.bytes_per_element
    # everything but the linear layers' FP8 GEMMs runs at the engine's (bf16) rate
    peak = cluster.peak_flops(engine_precision(layout.precision))
    fp8 = fp8_gemms(cluster, layout.fp8_recipe, layout.fused_kernels)
    memory = estimate_memory(model, cluster, layout, knobs)
    slowest: StageLoad | None = None
    slowest_stage: dict[str, Any] = {}
    early_stop = skips_down_projection(model, layout)
    experts = placement(model, layout, act.hf_modules(layout))
    if (
        layout.cuda_graphs
    ):  # the graph replays its kernels: no host issue (compute.py's issue floor, MoE syncs)
        cluster = cluster.model_copy(update={"kernel_launch_us": 0.0})
    for st in candidate_stages(model, layout):
        blocks, moe_blocks = with_mtp(model, st)
        rank = rank_params(
            pc, layout, blocks, moe_blocks, st.embedding, st.head, knobs.stage3_param_persistence_threshold
        )
        stage = dict(
            micro_batch=layout.micro_batch_size,
            e=e,
            tp=layout.tp,
            sp=layout.sp,
            dense_layers=st.blocks - st.moe_blocks,
            moe_layers=st.moe_blocks,
            last=st.head,
            mtp=st.mtp,
            experts=experts,
            recompute=layout.recompute,
            modules=layout.recomputed_modules,
            recompute_every=layout.recompute_every or 1,
            early_stop=early_stop,
            flash=act.flash_attention(model, layout),
            sequence_parallel=layout.tp_sequence_parallel,
            frozen=layout.lora is not None,
            fused_kernels=layout.fused_kernels,
            ep=layout.ep,
            hf_modules=act.hf_modules(layout),
        )
        compute = stage_compute(model, pc, cluster, **stage, peak=peak, fp8=fp8)
        trainable = _lora_params(model, layout, st.blocks)
        load = StageLoad(
            compute=compute,
            dense_params=rank.dense if trainable is None else trainable,
            expert_params=rank.expert if trainable is None else 0.0,
            n_blocks=blocks,
            n_moe_blocks=moe_blocks,
        )
        if slowest is None or compute.total_s > slowest.compute.total_s:
            slowest, slowest_stage = load, stage
    assert slowest is not None
    slowdowns: dict[int | None, float] = {}  # by the SMs held: NCCL's for both overlaps under alltoall

    def slowed(held: int | None) -> float:
        if held not in slowdowns:
            total = slowest.compute.total_s
            slowdowns[held] = slowed_by_collectives(model, pc, cluster, slowest_stage, peak, fp8, total, held)
        return slowdowns[held]

    # ZeRO-2/3, FSDP and Megatron-Core's overlaps run data-parallel collectives beside compute (ZeRO-0/1's follow
    # backward): price that compute on the SMs NCCL leaves it
    if layout.zero_dp > 1 and (layout.zero_stage >= 2 or layout.comm_overlap or layout.fsdp is not None):
        slowest = replace(slowest, overlap_slowdown=slowed(cluster.collective_sm_count))
    if layout.ep_comm_overlap and slowest.n_moe_blocks:
        # the expert all-to-alls run beside the other micro-batch's compute, on the SMs their kernels leave it
        slowest = replace(slowest, ep_overlap_slowdown=slowed(dispatcher_sms(layout, cluster)))
    time = step_time(model, cluster, layout, slowest, knobs)
    return Estimate(model=model, cluster=cluster, layout=layout, knobs=knobs, memory=memory, time=time)
