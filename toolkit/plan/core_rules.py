"""Rules of Megatron-Core's runtime (`--target megatron-core`): the knobs only it has, and how they combine.

Scope "core" holds what only Megatron-Core runs — the DeepSpeed engine and Megatron-DeepSpeed refuse it, `dstk
estimate` prices it, `--target megatron-core` writes it; scope "megatron-core" what Megatron-Core cannot run
as dstk would configure it. The combination rules quote Megatron-LM's own checks at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553: megatron/training/arguments.py (A) and
megatron/core/transformer/transformer_config.py (TC).
"""

from __future__ import annotations

import json

from toolkit.plan import pipeline_layout
from toolkit.plan.layout import LayoutRequest, default_precision
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
        (
            r.recompute_modules not in (None, "core_attn"),
            f"--recompute-modules {r.recompute_modules} (Megatron-Core's fine-grained recomputation)",
        ),
        (r.ep_comm_overlap, "--ep-comm-overlap (--overlap-moe-expert-parallel-comm)"),
        (r.pipeline_layout is not None, "--pipeline-layout"),
        (r.cuda_graphs, "--cuda-graphs (--cuda-graph-impl full_iteration)"),
        (r.fp8_scaling == "current", "--fp8-scaling current (--fp8-recipe tensorwise)"),
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
    recomputation, at most one MTP layer, 16-bit weights, and with PP > 1 an interleaved schedule
    (TC:3002-3047)."""
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
    if (r.precision or default_precision(c)) == "fp32":
        return "--ep-comm-overlap: Megatron-Core runs it with bf16 or fp16 weights only, not fp32"
    if m.mtp_layers > 1:
        return f"--ep-comm-overlap: Megatron-Core allows at most 1 MTP layer with it (mtp_layers: {m.mtp_layers})"
    return None


def _architecture_problems(m: ModelSpec) -> list[str]:
    """What Megatron-Core's GPTModel, with the flags dstk writes (toolkit/integrations/megatron_core.py), builds
    differently from the model described."""
    f = m.family
    problems = []
    if m.trace is not None:
        problems.append("a traced model (no family entry to translate into Megatron flags)")
    if m.position_embedding == "alibi":
        problems.append("ALiBi positions (--position-embedding-type has no alibi, arguments.py:2397)")
    if m.embedding_norm:
        problems.append("a LayerNorm after the word embedding")
    biases = (m.attention_bias, m.attention_out_bias, m.mlp_bias)
    if biases not in ((True, True, True), (False, False, False), (True, False, False)):
        problems.append("biases on some linear layers only (all, none, or q/k/v only with --add-qkv-bias)")
    if m.gated_mlp and m.activation != "silu":
        problems.append(f"a gated {m.activation} MLP (--swiglu is SiLU)")
    if not m.gated_mlp and m.activation in ("silu", "relu"):
        problems.append(f"an ungated {m.activation} MLP (GeLU, or --swiglu)")
    if not m.gated_mlp and m.activation in ("gelu_new", "gelu_pytorch_tanh") and not m.mlp_bias:
        # the tanh GeLU is the fused bias-GeLU (core/fusions/fused_bias_gelu.py:17-19); without a bias it is F.gelu
        problems.append("the tanh-approximated GeLU without MLP biases")
    if f.qk_norm_full or f.qk_l2_norm_local:
        problems.append("q/k norms other than per-head RMSNorm/LayerNorm")
    if f.norms_per_block != 2:
        problems.append(f"{f.norms_per_block} norms per block (pre-norm only)")
    if f.embedding_scale:
        problems.append("embeddings scaled by √h")
    if m.sliding_window is not None:
        problems.append("sliding-window layers (dstk writes no --window-size)")
    if f.attention_sinks:
        problems.append("attention sinks (dstk writes no --softmax-type learnable)")
    if f.attention_softcap:
        problems.append("soft-capped attention logits")
    if _rope_scaling(m):
        problems.append(f"RoPE scaling ({_rope_scaling(m)} in its config.json; dstk writes plain RoPE)")
    if m.is_moe and f.router_bias:
        problems.append("a router with a bias")
    if m.is_moe and f.router_score == "sigmoid" and m.moe_top_k > 1 and not m.moe_renormalize:
        # core/transformer/moe/moe_utils.py:929: sigmoid top-k weights are always divided by their sum
        problems.append("sigmoid router weights that are not renormalised")
    return problems


def _rope_scaling(m: ModelSpec) -> str | None:
    """The RoPE scaling type an HF config.json sets (`rope_scaling`, or transformers 5's `rope_parameters`)."""
    if m.hf_config_json is None:
        return None
    hf = json.loads(m.hf_config_json)
    for block in (hf.get("rope_scaling"), hf.get("rope_parameters")):
        kind = (block or {}).get("rope_type") or (block or {}).get("type")
        if kind not in (None, "default"):
            return str(kind)
    return None


def core_model_problem(m: ModelSpec, c: ClusterSpec) -> str | None:
    """The model (or the machines) Megatron-LM's pretrain_gpt.py cannot train as dstk would write it."""
    problems = _architecture_problems(m)
    if problems:
        return (
            f"--target megatron-core: Megatron-Core's GPT model as dstk writes it cannot express "
            f"{'; '.join(problems)} ({m.name}, {m.family_label})"
        )
    if c.accelerator != "cuda":
        return (
            f"--target megatron-core: Megatron-LM trains on CUDA (and ROCm) GPUs; cluster {c.name} is "
            f"{c.accelerator}"
        )
    return None


def core_runs(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """What Megatron-Core's training loop cannot run as dstk would configure it: its distributed optimizer
    shards optimizer states and master weights (ZeRO-1, `--use-distributed-optimizer`), while ZeRO-2/3, ZeRO++,
    DeepSpeed's offload, 1-bit optimizers and LoRA are DeepSpeed's or dstk train's; and the parallel layouts
    its checks refuse or warn about. (A model it cannot build is refused once, before any layout:
    `core_model_problem`, which `dstk plan` and `dstk config` ask for --target megatron-core.)"""
    if r.zero_stage > 1:
        return f"--zero-stage: Megatron-Core's distributed optimizer is ZeRO-1; stage {r.zero_stage} is DeepSpeed's"
    if r.offload_optimizer != "none" or r.offload_param != "none" or r.offload_activations:
        return "--offload-*: DeepSpeed's ZeRO-Offload/Infinity; Megatron-Core runs without them here"
    if r.optimizer != "adamw" or r.zeropp or r.lora:
        return (
            "--optimizer/--zeropp/--lora: DeepSpeed's or dstk train's; Megatron-Core runs AdamW, full weights"
        )
    if r.recompute_early_stop and r.recompute == "full":
        return (
            "--recompute-early-stop: Megatron-Core's checkpoint (tensor_parallel.checkpoint) is reentrant and "
            "recomputes whole layers; drop the flag"
        )
    return _context_parallel(m, r) or _tensor_parallel(m, r) or _experts(m, r)


def _context_parallel(m: ModelSpec, r: LayoutRequest) -> str | None:
    """`--sp` is context parallelism with the all-to-all exchange (`--cp-comm-type a2a`): Megatron needs the
    sequence in 2·CP chunks (arguments.py:1335-1338), Transformer Engine every q, k and v head count on a TP
    rank divisible by CP (dot_product_attention/context_parallel.py:4246, "cp_comm_type='a2a' requires
    num_heads % cp_size == 0 for Q, K, V")."""
    if r.sp == 1:
        return None
    if m.seq_length % (2 * r.sp):
        return f"--sp: Megatron-Core's context parallelism needs seq_length({m.seq_length}) divisible by 2 × sp({r.sp})"
    kv = (
        m.n_heads if m.kv_lora_rank is not None else m.n_kv_heads
    )  # latent attention expands k and v per head
    heads = (m.n_heads // r.tp, max(kv // r.tp, 1))
    if heads[0] % r.sp or heads[1] % r.sp:
        return (
            f"--sp: context parallelism over {r.sp} ranks (all-to-all) needs the query and key/value heads per TP "
            f"rank ({heads[0]}, {heads[1]}) divisible by it"
        )
    return None


def _tensor_parallel(m: ModelSpec, r: LayoutRequest) -> str | None:
    """Megatron-Core splits the word embedding over TP always (VocabParallelEmbedding), overlaps TP collectives
    only under sequence parallelism (arguments.py:1441-1442), and with experts over EP × TP wants sequence
    parallelism ("must be used", model_parallel_config.py:560-564)."""
    if r.tp == 1:
        return None
    if not r.tp_vocab_parallel:
        return (
            "--tp-vocab-parallel: Megatron-Core always splits the word embedding over TP (VocabParallelEmbedding); "
            "drop --no-tp-vocab-parallel"
        )
    if r.tp_sequence_parallel:
        return None
    if r.comm_overlap:
        return "--comm-overlap: Megatron-Core's --tp-comm-overlap needs --tp-sequence-parallel with --tp > 1"
    if m.is_moe and r.ep > 1:
        return "--tp-sequence-parallel: Megatron-Core runs experts over --ep with --tp > 1 only with it"
    return None


def _experts(m: ModelSpec, r: LayoutRequest) -> str | None:
    """Megatron-Core always folds experts over TP × CP × DP (`--expert-tensor-parallel-size` defaults to TP,
    arguments.py:587-588); without --etp the layout is DeepSpeed's MoE (experts whole on every TP rank, inside
    DP), which is the folding with ETP 1 only when tp = sp = 1. Experts with biases need ETP 1
    (transformer_config.py:2612-2615)."""
    if not m.is_moe:
        return None
    if r.etp is None and (r.tp > 1 or r.sp > 1):
        return (
            f"--etp: Megatron-Core folds experts over TP × CP × DP; the layout without it prices DeepSpeed's MoE "
            f"(experts whole on each of tp({r.tp}) × sp({r.sp}) ranks); give --etp 1, or the ETP to split them over"
        )
    if m.mlp_bias and (r.etp or 1) > 1:
        return f"--etp: Megatron-Core splits experts with biases over one rank only; etp({r.etp}) must be 1"
    return None


def core_kernels_fused(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """Megatron-Core runs fused kernels: Transformer Engine's norms fused into its linear layers, Megatron's
    bias-activation, RoPE and softmax fusions (on by default in arguments.py). dstk writes no flag to unfuse
    them, so a layout priced with eager kernels (`--no-fused-kernels`) is not what the run would be. Checked
    last, after every other rule: the layout request's default is unfused (the DeepSpeed engine's HF modules),
    and `dstk plan`/`dstk config` fill in fused for this target unless the flag was given."""
    if not r.fused_kernels:
        return (
            "--no-fused-kernels: Megatron-Core runs Transformer Engine's fused norms and Megatron's fused "
            "bias-activation and RoPE kernels; drop the flag"
        )
    return None


def fp8_scaling_needs_te(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """`--fp8-scaling` picks Transformer Engine's recipe for `--precision fp8`, which Megatron's fused blocks
    run (`--fused-kernels` without `--fsdp`); dstk train's HF modules and PyTorch FSDP runs cast with
    torchao.float8, which scales each tensor from its own amax anyway."""
    if r.fp8_scaling is None:
        return None
    if r.precision != "fp8":
        return f"--fp8-scaling: the scaling of --precision fp8's casts; got --precision {r.precision or 'default'}"
    if not r.megatron_stack:
        return (
            "--fp8-scaling: Transformer Engine's scaling in Megatron's fused blocks (--fused-kernels without "
            "--fsdp); dstk train and PyTorch FSDP runs cast with torchao.float8 (tensorwise, current scaling)"
        )
    return None
