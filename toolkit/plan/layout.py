"""Layouts: how a model is spread over a cluster, and the one function that owns their arithmetic.

A :class:`LayoutRequest` is what the user (or the planner) asks for, with blanks; :func:`toolkit.plan.rules.resolve_layout`
fills the blanks, checks every rule in :mod:`toolkit.plan.rules` and returns a fully explicit :class:`Layout`.
`world = tp · pp · sp · dp` and `global_batch = micro_batch · grad_accum · dp` live here and nowhere else.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolkit.errors import UserError
from toolkit.plan.recompute_modules import normal_modules, recomputed
from toolkit.plan.specs import LOW_PRECISION_GEMMS, ClusterSpec, Precision

Recompute = Literal["none", "selective", "full", "ops"]
OffloadDevice = Literal["none", "cpu", "nvme"]
Optimizer = Literal["adamw", "onebit-adam", "zero-one-adam"]

BYTES_PER_ELEMENT: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2, "mxfp8": 2, "nvfp4": 2}
"""Bytes of a parameter, gradient or activation element. fp8, mxfp8 and nvfp4 keep them all in bf16: only the
linear layers' GEMM operands are cast to the narrow format, and the cost model prices those casts apart
(toolkit/plan/cost/fp8.py)."""


def engine_precision(precision: Precision) -> Precision:
    """The precision the DeepSpeed engine (and Megatron's `--bf16`) runs: fp8, mxfp8 and nvfp4 train in bf16
    with narrow linear GEMMs, which the engine never sees (its JSON has no FP8 key; the `dstk` block carries
    the layout's)."""
    return "bf16" if precision in LOW_PRECISION_GEMMS else precision


def data_parallel_size(world_size: int, tp: int = 1, pp: int = 1, sp: int = 1) -> int:
    """Data-parallel replicas of a job: world / (tp · pp · sp), the one place this arithmetic lives (callers
    check divisibility first, with a message of their own)."""
    return world_size // (tp * pp * sp)


_STRICT = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

# CLI flag of each LayoutRequest field (docs/ARCHITECTURE.md: how a flag reaches the engine); help text comes from the
# field docstrings.
LAYOUT_FLAGS: dict[str, str] = {
    "zero_stage": "--zero-stage",
    "tp": "--tp",
    "pp": "--pp",
    "ep": "--ep",
    "sp": "--sp",
    "micro_batch_size": "--micro-batch",
    "global_batch_size": "--global-batch",
    "gradient_accumulation_steps": "--grad-accum",
    "recompute": "--recompute",
    "recompute_every": "--recompute-every",
    "recompute_early_stop": "--recompute-early-stop",
    "recompute_modules": "--recompute-modules",
    "offload_optimizer": "--offload-optimizer",
    "offload_param": "--offload-param",
    "offload_activations": "--offload-activations",
    "precision": "--precision",
    "fp8_scaling": "--fp8-scaling",
    "optimizer": "--optimizer",
    "tp_sequence_parallel": "--tp-sequence-parallel",
    "tp_vocab_parallel": "--tp-vocab-parallel",
    "zeropp": "--zeropp",
    "fused_kernels": "--fused-kernels",
    "flash_attention": "--flash-attention",
    "virtual_stages": "--virtual-stages",
    "comm_overlap": "--comm-overlap",
    "etp": "--etp",
    "moe_dispatcher": "--moe-dispatcher",
    "moe_routing": "--moe-routing",
    "ep_comm_overlap": "--ep-comm-overlap",
    "pipeline_layout": "--pipeline-layout",
    "cuda_graphs": "--cuda-graphs",
    "fsdp": "--fsdp",
    "fsdp_backward_prefetch": "--fsdp-backward-prefetch",
    "lora": "--lora",
}


class LayoutRequest(BaseModel):
    """A layout with blanks (None): the CLI flags of `estimate`/`config`, or one point of the planner's search."""

    model_config = _STRICT

    zero_stage: Literal[0, 1, 2, 3] = 0
    """ZeRO stage: 0 plain data parallel, 1 optimizer states, 2 + gradients, 3 + parameters partitioned."""
    tp: int = Field(default=1, gt=0)
    """Tensor-parallel degree (Megatron-style / DeepSpeed AutoTP)."""
    pp: int = Field(default=1, gt=0)
    """Pipeline-parallel stages."""
    ep: int = Field(default=1, gt=0)
    """Expert-parallel degree (MoE only); carved out of the data-parallel ranks."""
    sp: int = Field(default=1, gt=0)
    """Sequence-parallel degree (DeepSpeed-Ulysses); carved out of the data-parallel ranks."""
    micro_batch_size: int = Field(default=1, gt=0)
    """Sequences per micro-batch per data-parallel rank."""
    global_batch_size: int | None = Field(default=None, gt=0)
    """Sequences per optimizer step over all ranks (default: micro_batch_size · grad_accum · dp)."""
    gradient_accumulation_steps: int | None = Field(default=None, gt=0)
    """Micro-batches per optimizer step (default: derived from the global batch, else 1)."""
    recompute: Recompute = "none"
    """Activation recomputation: none, selective (attention core, Korthikanti et al.), full, or ops —
    torchtitan's op-level selective checkpointing (its Llama default: every matmul's output but every second
    one's, and the attention's, saved; the rest of each block recomputed), `dstk estimate` with --fsdp only."""
    recompute_every: int | None = Field(default=None, gt=0)
    """With --recompute full: checkpoint only every K-th block, the others keep all their activations
    (torchtitan's `selective_ac_option = K`, fms-fsdp's `selective_checkpointing = K` before 2024-03-21:
    `count % K == 0` in both); `dstk estimate` only, for published runs — DeepSpeed and Megatron checkpoint
    every block. Unset: every block."""
    recompute_modules: str | None = None
    """With --recompute selective: what Megatron-Core rebuilds, comma-separated (core_attn, layernorm, moe_act,
    mla_up_proj, mlp, shared_experts; toolkit/plan/recompute_modules.py). Unset: core_attn, the attention core."""
    recompute_early_stop: bool | None = None
    """With --recompute full: the checkpoint stops recomputing a block once every tensor its backward needs is
    back, so each block's last linear layer (the MLP's down projection; its output only feeds the residual
    add) is not recomputed. PyTorch's non-reentrant checkpoint does this by default since 2.1 (pytorch#96866:
    the pack hook holding the last saved tensor, an input of that GEMM, stops the recomputation), as HF
    models (transformers 5), llm-foundry, torchtitan until 2025-08 and fms-fsdp run it. Not with dropout after
    that layer (its mask is saved after the GEMM), MoE blocks (the router weights multiply the experts'
    output), a LoRA adapter on the down projection, or torchao's Float8Linear (an autograd.Function saves
    after its GEMM). Off: reentrant checkpoints (Megatron's, DeepSpeed's, HF transformers 4's) recompute the
    whole block. Unset: on for --fsdp and dstk train's HF modules, except with --pp or --offload-activations
    (DeepSpeed's reentrant checkpoint) and at ZeRO-3 (DeepSpeed's `memory_efficient_linear` saves after each
    GEMM); off for the fused stacks (--fused-kernels without --fsdp: Megatron, NeMo) and --target megatron."""
    offload_optimizer: OffloadDevice = "none"
    """Where ZeRO keeps optimizer states (ZeRO-Offload / ZeRO-Infinity)."""
    offload_param: OffloadDevice = "none"
    """Where ZeRO-3 keeps parameters between uses (ZeRO-Infinity)."""
    offload_activations: bool = False
    """Keep the checkpointed block inputs of full recomputation in host memory (DeepSpeed's
    `activation_checkpointing.cpu_checkpointing`, ZeRO-Infinity's activation offload): the GPU holds a few
    block inputs instead of one per block, at a PCIe copy each way per block and micro-batch."""
    precision: Precision | None = None
    """Training precision (default: bf16 where supported, else fp16, else fp32). fp8: bf16 training whose
    linear layers (QKV, attention output, MLP) run their GEMMs in FP8 — Transformer Engine under --target
    megatron, torchao.float8 in dstk train — on GPUs with FP8 tensor cores (Ada, Hopper and newer). mxfp8,
    nvfp4: the same with Transformer Engine's MXFP8BlockScaling / NVFP4BlockScaling recipes (Megatron-Core's
    `--fp8-recipe mxfp8`, `--fp4-recipe nvfp4`), on GPUs with those tensor cores (Blackwell; MXFP8 also
    AMD CDNA4); `dstk estimate` prices them, neither runtime dstk configures runs them."""
    fp8_scaling: Literal["delayed", "current"] | None = None
    """With --precision fp8 on Megatron's fused stack, Transformer Engine's scaling: `delayed` (DelayedScaling,
    amax history; the default, Megatron-DeepSpeed's only) or `current` (Float8CurrentScaling, Megatron-Core's
    `--fp8-recipe tensorwise`, NVIDIA's fp8_cs recipes: each cast reads its tensor twice, amax then cast)."""
    optimizer: Optimizer = "adamw"
    """AdamW, or dstk's 1-bit Adam / 0/1 Adam (compressed communication, ZeRO stage 0 only)."""
    tp_sequence_parallel: bool = False
    """Megatron's sequence parallelism inside the TP group (Korthikanti et al. 2022): norms, dropout and
    residuals are sharded over the sequence, so their activations divide by tp; same communication volume."""
    tp_vocab_parallel: bool = False
    """Split the word embedding over TP too (Megatron's VocabParallelEmbedding); DeepSpeed AutoTP, the
    default, keeps it whole and splits only an untied LM head."""
    zeropp: bool = False
    """ZeRO++ (Wang et al. 2023) on ZeRO-3: int8 weight all-gather, int4 gradient reduce-scatter, and a
    secondary weight partition inside each node so backward gathers stay on NVLink."""
    fused_kernels: bool = False
    """The runtime fuses the memory-bound work of a block (RMSNorm, rotary embedding, bias + activation) as
    Megatron-LM / Megatron-DeepSpeed and vendor training stacks do; off: HF modules in eager mode, as `dstk
    train` runs them (RMSNorm upcast to fp32 in seven kernels, rotary in five per tensor), which the cost model
    then prices op by op."""
    flash_attention: bool | None = None
    """Fused attention that never stores the a·s² scores (FlashAttention, SDPA's fused kernels). Default:
    what the runtime runs — HF modules in the DeepSpeed engine use SDPA wherever the family has it (on),
    Megatron-DeepSpeed's CoreAttention materializes the scores (off; on adds `--use-flash-attn-v2` to its
    launch). Off, the cost model prices the scores' HBM traffic and keeps them for backward."""
    virtual_stages: int = Field(default=1, gt=0)
    """Model chunks per pipeline rank (Megatron's interleaved 1F1B, `--num-layers-per-virtual-pipeline-stage`):
    the bubble shrinks v-fold, (p−1)/(v·m), at v times the pipeline sends (Narayanan et al. 2021, §2.2.2)."""
    comm_overlap: bool = False
    """Megatron-Core's communication overlap, as NeMo and Megatron-LM's H100 recipes run it: the distributed
    optimizer's gradient reduce-scatter behind backward and its parameter all-gather behind the next forward
    (`--overlap-grad-reduce --overlap-param-gather`), and Transformer Engine's userbuffers hiding each TP
    collective behind the GEMM beside it (`--tp-comm-overlap`). Off: DeepSpeed's schedule, where ZeRO-1/2's
    all-gather of updated parameters follows the step and TP collectives sit between GEMMs."""
    etp: int | None = Field(default=None, gt=0)
    """Expert tensor parallelism, Megatron-Core's `--expert-tensor-parallel-size`. Set, the MoE layers run as
    Megatron-Core runs them ("MoE Parallel Folding", Liu et al. 2025): experts over ETP × EP × EDP ranks drawn
    from the same ranks as attention's TP × CP × DP (EP may exceed DP), each TP/CP rank dispatching its own
    tokens, each expert split over ETP ranks. Unset: DeepSpeed's MoE (EP inside DP, experts whole on every TP
    rank, which drop the duplicate tokens of TP before the all-to-all)."""
    moe_dispatcher: Literal["alltoall", "allgather", "deepep", "hybridep"] | None = None
    """How tokens reach their experts (Megatron-Core's `--moe-token-dispatcher-type`): NCCL all-to-all
    (`alltoall`), all-gather then reduce-scatter over the expert group (`allgather`), or the flex dispatcher's
    DeepEP / HybridEP kernels. Unset: all-to-all."""
    moe_routing: Literal["natural", "balanced"] = "natural"
    """How the router spreads tokens over the expert-parallel ranks; the slowest rank sets the pace.
    `balanced`: Megatron-Core's `--moe-router-force-load-balancing`, as NVIDIA's published MoE benchmarks run:
    random logits, i.e. a uniform router, whose ranks still get binomially spread loads (priced as the
    expected largest of them). `natural`: dropless routing by the model's own router, priced at that same
    spread — a lower bound, since a trained router prefers some experts."""
    ep_comm_overlap: bool = False
    """Megatron-Core's `--overlap-moe-expert-parallel-comm` (with `--delay-wgrad-compute`): each micro-batch's
    dispatch and combine run beside another micro-batch's compute in 1F1B, hidden as far as that lasts."""
    cuda_graphs: bool = False
    """Megatron-Core's full-iteration CUDA graph (`--cuda-graph-impl full_iteration`, MoE layers padded to
    static shapes): the step replays one graph, so no kernel costs host time and no MoE layer waits on the host.
    Off: every kernel is issued by the host, and a dropless MoE layer's sync stops it queueing ahead."""
    pipeline_layout: str | None = None
    """Which blocks each pipeline stage holds, in Megatron-Core's `--pipeline-model-parallel-layout` syntax:
    stages separated by `|`, `E` the embedding, `t` a block, `m` a multi-token-prediction layer, `L` the loss
    (the LM head), `x*n` n repeats, `(…)*n` a repeated group; pp × virtual stages of them, virtual stage i on
    rank i mod pp (e.g. `Et*3|(tt|)*29m|L`). Unset: blocks split evenly, earlier stages taking the remainder."""
    fsdp: Literal["bf16", "fp32"] | None = None
    """PyTorch FSDP's runtime instead of DeepSpeed's (`dstk estimate` only, for published FSDP runs), named by
    the dtype it reduce-scatters gradients in (`MixedPrecision(reduce_dtype=...)`): ZeRO-3 prices FULL_SHARD,
    ZeRO-2 SHARD_GRAD_OP. FSDP all-gathers each wrapped block's flat parameter in one call, one block ahead of
    the compute that needs it, and reduce-scatters each block's gradients in one call as its backward ends;
    only the first gather and the last reduce-scatter of a micro-batch cannot overlap (PyTorch's FSDP notes,
    "FSDP Prefetch Nuances"; FSDP2's `fully_shard` per block). Off: DeepSpeed's ZeRO, which gathers module by
    module in prefetch buckets and reduces in gradient buckets."""
    fsdp_backward_prefetch: Literal["pre", "post"] | None = None
    """With --fsdp at ZeRO-3 (FULL_SHARD): when FSDP issues the next block's backward all-gather (FSDP1's
    `backward_prefetch`). `pre` (BackwardPrefetch.BACKWARD_PRE, FSDP1's own default; FSDP2 prefetches so
    too) issues it before the current block's gradient computation, which it then overlaps; `post`
    (BACKWARD_POST, MosaicML composer's default) issues it after, so the gather waits for that computation and
    the next block's computation waits for the gather: every backward all-gather is exposed, only the
    reduce-scatters overlap the next block's computation (torch.distributed.fsdp.BackwardPrefetch: "any
    collectives, even if issued from different streams, contend for the same per-device NCCL stream"). Unset: pre."""
    lora: str | None = None
    """LoRA fine-tuning, e.g. `r=16,alpha=32[,dropout=0.05][,targets=q_proj+v_proj]`: adapters train, the
    base weights are frozen (no gradients or optimizer states for them); see toolkit/plan/lora.py."""

    @property
    def megatron_stack(self) -> bool:
        """Megatron's runtimes (Megatron-LM, Megatron-DeepSpeed, Megatron-Core, NeMo): `--fused-kernels`
        without PyTorch FSDP, whose `--fused-kernels` is torch.compile."""
        return self.fused_kernels and self.fsdp is None

    @field_validator("recompute_modules")
    @classmethod
    def _normal_recompute_modules(cls, value: str | None) -> str | None:
        return normal_modules(value)

    @field_validator("lora")
    @classmethod
    def _normal_lora(cls, value: str | None) -> str | None:
        from toolkit.plan.lora import parse_lora

        return None if value is None else parse_lora(value).text()


class Layout(LayoutRequest):
    """A resolved layout: every field explicit and consistent with the model and the cluster."""

    precision: Precision
    dp: int = Field(gt=0)
    """Data-parallel degree: world / (tp · pp · sp)."""
    global_batch_size: int = Field(gt=0)
    gradient_accumulation_steps: int = Field(gt=0)
    world_size: int = Field(gt=0)
    """Ranks in the job: nodes · gpus_per_node."""

    @property
    def bytes_per_element(self) -> int:
        """Bytes of one parameter, gradient or activation element at the training precision."""
        return BYTES_PER_ELEMENT[self.precision]

    @property
    def fp8_recipe(self) -> Literal["delayed", "current", "tensorwise", "mxfp8", "nvfp4"] | None:
        """How the linear layers' GEMMs get their narrow operands (None: a bf16/fp16/fp32 layout): Transformer
        Engine's delayed or current scaling (`fp8_scaling`) in Megatron's fused blocks, torchao.float8's dynamic
        tensorwise scaling in the eager HF modules dstk train runs and in PyTorch FSDP runs (torchtitan;
        compiled with --fused-kernels); for mxfp8 and nvfp4 Transformer Engine's block-scaled recipe of that
        name, whatever the runtime. toolkit/plan/cost/fp8.py prices them."""
        if self.precision in ("mxfp8", "nvfp4"):
            return self.precision
        if self.precision != "fp8":
            return None
        return (self.fp8_scaling or "delayed") if self.megatron_stack else "tensorwise"

    @property
    def recomputed_modules(self) -> frozenset[str]:
        """What selective recomputation rebuilds (toolkit.plan.recompute_modules.recomputed)."""
        return recomputed(self.recompute, self.recompute_modules)

    @property
    def recompute_stops_early(self) -> bool:
        """Whether full recomputation leaves out each block's last linear layer (`recompute_early_stop`,
        resolved; the model-side exceptions are the cost model's: toolkit.plan.cost.compute.early_stop_skips)."""
        if self.recompute != "full":
            return False
        if self.recompute_early_stop is not None:
            return self.recompute_early_stop
        # PyTorch FSDP, or dstk train's HF modules below ZeRO-3: DeepSpeed's zero.Init swaps
        # torch.nn.functional.linear for LinearFunctionForZeroStage3 (`memory_efficient_linear`, on by default
        # and never swapped back), an autograd.Function that saves its inputs after its GEMM has run
        torch_checkpoint = self.fsdp is not None or (not self.fused_kernels and self.zero_stage != 3)
        return torch_checkpoint and self.pp == 1 and not self.offload_activations

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.sp

    @property
    def expert_dp(self) -> int:
        """Ranks that hold replicas of the same experts (the expert-data-parallel group): the data-parallel
        ranks over EP under DeepSpeed; under Megatron-Core's folding (`etp` set) the stage's ranks, TP × CP ×
        DP, over ETP × EP."""
        if self.etp is not None:
            return max(1, self.tp * self.sp * self.dp // (self.etp * self.ep))
        return self.dp // self.ep

    @property
    def zero_dp(self) -> int:
        """Ranks that hold the same dense parameters and train on different tokens: the data-parallel ranks times
        the sequence-parallel ones. ZeRO partitions model states over them and gradients are reduced across them
        — DeepSpeed's `seq_data_parallel_group` ("the process group for zero sharding and gradient allreduce must
        be across both dimensions of data and sequence parallelism", deepspeed/utils/groups.py), Megatron-Core's
        data-parallel group `with_context_parallel=True` (distributed optimizer and gradient buffers),
        torchtitan's FSDP mesh ("This includes dp_shard and cp", distributed/parallel_dims.py). Without SP, dp."""
        return self.dp * self.sp

    @property
    def expert_zero_dp(self) -> int:
        """`zero_dp` for the experts: the expert-data-parallel ranks times the sequence-parallel ones, which see
        other tokens of the same sequences with the same experts (folded in already under Megatron-Core)."""
        return self.expert_dp if self.etp is not None else self.expert_dp * self.sp

    def describe(self, short: bool = False) -> str:
        """The layout in one line, the only printer of it: `ZeRO-3 tp=1 pp=1 dp=8 micro=2 accum=16 global=256
        recompute=selective bf16` (long, for explanations and reports) or `ZeRO-3 tp1 pp1 dp8 mb2 selective`
        (short, for chart labels and de-duplicating runner-ups)."""
        if short:
            text = f"ZeRO-{self.zero_stage} tp{self.tp} pp{self.pp} dp{self.dp}"
            text += f" mb{self.micro_batch_size} {self.recompute}"
            if self.ep > 1:
                text += f" ep{self.ep}"
            if self.etp is not None and self.etp > 1:
                text += f" etp{self.etp}"
            if self.sp > 1:
                text += f" sp{self.sp}"
            if self.zeropp:
                text += " zero++"
            if self.offload_optimizer != "none" or self.offload_param != "none":
                text += f" offload {self.offload_optimizer}/{self.offload_param}"
            if self.offload_activations:
                text += " act-offload"
            return text
        parts = [f"ZeRO-{self.zero_stage}", f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}"]
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.etp is not None:
            parts.append(f"etp={self.etp}")
        if self.ep > 1 and self.moe_dispatcher is not None:
            parts.append(self.moe_dispatcher)
        if self.sp > 1:
            parts.append(f"sp={self.sp}")
        if self.virtual_stages > 1:
            parts.append(f"vp={self.virtual_stages}")
        parts += [
            f"micro={self.micro_batch_size}",
            f"accum={self.gradient_accumulation_steps}",
            f"global={self.global_batch_size}",
            f"recompute={self.recompute}",
            self.precision,
        ]
        if self.offload_optimizer != "none":
            parts.append(f"offload_optimizer={self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"offload_param={self.offload_param}")
        if self.offload_activations:
            parts.append("offload_activations=cpu")
        if self.optimizer != "adamw":
            parts.append(self.optimizer)
        return " ".join(parts)

    def flags(self) -> list[str]:
        """The CLI flags that reproduce this layout (for `dstk estimate` and the explanation)."""
        out = []
        for name, flag in LAYOUT_FLAGS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool):
                out.append(flag if value else f"--no-{flag[2:]}")
            else:
                out.append(f"{flag}={value}")
        return out


def default_precision(cluster: ClusterSpec) -> Precision:
    """The precision the accelerator computes fastest: bf16 where it is supported and at least as fast as
    fp32 (every GPU with bf16 tensor cores, a CPU with AVX512-BF16/AMX), else fp16 where supported and faster
    (V100, T4), else fp32 — so never bf16 where it is emulated (an AVX2-only CPU runs torch's bf16 matmul
    ~75× slower than fp32) and never fp16 on CPU, which DeepSpeed rejects."""
    return fastest_precision(
        {p: cluster.peak_flops(p) for p in ("bf16", "fp16", "fp32") if cluster.supports(p)}
    )


def fastest_precision(peak_flops: dict[str, float]) -> Precision:
    """bf16, then fp16, whichever of the supported precisions (the keys; fp32 always among them) computes at
    least as fast as fp32; else fp32. The one rule behind the planner's default and `dstk calibrate`'s choice
    of the precision it probes training in."""
    for precision in ("bf16", "fp16"):
        if precision in peak_flops and peak_flops[precision] >= peak_flops["fp32"]:
            return precision
    return "fp32"


def batch_arithmetic(micro: int, dp: int, global_batch: int | None, accum: int | None) -> tuple[int, int]:
    """(global_batch, grad_accum) with global = micro · accum · dp, or a UserError showing the arithmetic."""
    per_step = micro * dp
    if global_batch is None:
        accum = accum or 1
        return per_step * accum, accum
    if accum is not None and global_batch != per_step * accum:
        raise UserError(
            f"--global-batch: micro_batch_size({micro}) × gradient_accumulation_steps({accum}) × dp({dp}) "
            f"= {per_step * accum} != global_batch_size({global_batch})"
        )
    if global_batch % per_step:
        lower = max(per_step, global_batch // per_step * per_step)
        raise UserError(
            f"--global-batch: global_batch_size({global_batch}) is not divisible by micro_batch_size({micro}) "
            f"× dp({dp}) = {per_step}; valid nearby: {lower}, {lower + per_step}"
        )
    return global_batch, global_batch // per_step
