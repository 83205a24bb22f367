"""Activation memory per rank: what autograd keeps between forward and backward.

The per-layer terms generalise Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", §4, eq. 1-2) from GPT-style blocks to grouped-query attention, gated MLPs, models without
dropout and MoE blocks. For a GPT block (MHA, 4h GeLU MLP, dropout) in 16-bit precision they reduce exactly to
the paper's `s·b·h·(34 + 5·a·s/h)` bytes; with tensor parallelism to `s·b·h·(10 + 24/t + 5·a·s/(h·t))`; with
tensor + sequence parallelism to `s·b·h·(34 + 5·a·s/h)/t`; with selective recomputation (the attention core
is recomputed, as FlashAttention does by construction) the `a·s²` terms vanish; with full recomputation only
the block input is kept (`2·s·b·h`), plus one block's activations rebuilt during its backward; with
torchtitan's op-level policy (`ops`) the block input and the outputs of the ops it saves (`op_sac_matmuls`).

With `offload_activations` (DeepSpeed's `cpu_checkpointing`, ZeRO-Infinity §5.1.3) the block inputs of full
recomputation move to host memory and only the newest few stay on the device.

Pipelines keep several micro-batches in flight: with 1F1B, stage i of p holds min(p - i, m) of them, so the
first stage holds p (Narayanan et al. 2021, §2.2.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.plan.cost.attention import MASK_BYTES
from toolkit.plan.cost.fp8 import saved_input_bytes
from toolkit.plan.cost.moe import routed_copies
from toolkit.plan.cost.selective import kept_by, mlp_saved
from toolkit.plan.cost.traced_blocks import traced_block_bytes
from toolkit.plan.layout import Layout, LayoutRequest
from toolkit.plan.specs import LOW_PRECISION_GEMMS, ModelSpec

OFFLOAD_KEPT_ON_DEVICE = 3
"""Block inputs still on the GPU with `cpu_checkpointing`: DeepSpeed's offload engine keeps the newest one
(keep_last_count=1) and references up to two more until their asynchronous device-to-host copies finish
(runtime/activation_checkpointing/offload_activations.py, checkpointing.py:498-511; DeepSpeed 0.19.8)."""


SDPA_LSE_BYTES = 4
"""The fused attention kernel's log-sum-exp, fp32 per head and token, which it returns beside its output."""


def block_matmuls(model: ModelSpec, tp: int = 1) -> list[tuple[float, float, bool]]:
    """(in, out, bias) of a dense block's linear layers on one TP rank, in the order a Llama-style block runs
    them — torchtitan's and HF's alike: the q, k, v and output projections, then the MLP's gate, up and down
    (up and down without a gate)."""
    h = model.hidden_size
    q_w, kv_w = model.n_heads * model.head_dim / tp, model.n_kv_heads * model.head_dim / tp
    ffn, mlp_bias = model.ffn_hidden_size / tp, bool(model.mlp_bias)
    mlp = [(h, ffn, mlp_bias)] * (2 if model.gated_mlp else 1) + [(ffn, h, mlp_bias)]
    qkv_bias = bool(model.attention_bias)
    return [
        (h, q_w, qkv_bias),
        (h, kv_w, qkv_bias),
        (h, kv_w, qkv_bias),
        (q_w, h, bool(model.attention_out_bias)),
        *mlp,
    ]


def torchao_linears(recipe: str | None, compiled: bool) -> str | None:
    """ "eager" or "compiled" where the linear layers are torchao's Float8Linear (an fp8 layout's `tensorwise`
    recipe), else None (torch's nn.Linear)."""
    if recipe != "tensorwise":
        return None
    return "compiled" if compiled else "eager"


def op_sac_matmuls(
    model: ModelSpec, tp: int = 1, float8: str | None = None
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """((in, out) saved, (in, out) replayed) linear layers of a block under torchtitan's op-level selective
    checkpointing (`--recompute ops`; torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py,
    `_save_list` and `_custom_policy`, the Llama 3 configs' `selective_ac_option = 'op'`). The policy counts
    the block's aten.mm calls and saves each one's output but every second one's — in a Llama block q, v, gate
    and down are saved, k, the output projection and up recomputed — and saves the flash attention kernel's
    outputs (and reduce-scatters' and amax's); every other op is replayed from the block input in backward.
    torch's nn.Linear with a bias runs aten.addmm, which the policy neither counts nor saves; torchao's
    Float8Linear (`float8`: "eager" or "compiled", `torchao_linears`) runs aten.mm and adds its bias apart, so
    there every linear layer counts. The wrapper keeps torch's early stop (torchtitan@9dec370 passes none;
    torchtitan now turns it off), so a down projection left to the replay never runs again — unless dropout
    after it saves a mask or it is an eager Float8Linear, an autograd.Function that saves after its GEMM
    (toolkit.plan.cost.compute.early_stop_skips)."""
    saved: list[tuple[float, float]] = []
    replayed: list[tuple[float, float]] = []
    mm = 0
    matmuls = block_matmuls(model, tp)
    for i, (k, n, bias) in enumerate(matmuls):
        counted = not bias or float8 is not None
        mm += 1 if counted else 0
        if counted and mm % 2:
            saved.append((k, n))
        elif i < len(matmuls) - 1 or model.dropout or float8 == "eager":
            replayed.append((k, n))
    return saved, replayed


@dataclass(frozen=True)
class ActivationTerms:
    """Bytes one block keeps for one micro-batch on one rank, split by how tensor parallelism treats them."""

    sharded: float
    """Terms inside the TP region (divided by t)."""
    replicated: float
    """Norm inputs, the inputs of the first matmuls and residual dropout masks: replicated over TP unless
    sequence parallelism shards them too."""
    quadratic: float
    """The a·s² terms of the attention core (softmax, its dropout): gone with selective recomputation."""

    def per_rank(self, tp: int, sequence_parallel: bool) -> float:
        replicated = self.replicated / tp if sequence_parallel else self.replicated
        return replicated + (self.sharded + self.quadratic) / tp


def block_terms(
    model: ModelSpec,
    tokens: int,
    act_bytes: int,
    moe: bool,
    fp8_inputs: float = 0,
    hf_modules: bool = False,
    dense_experts: bool = True,
) -> ActivationTerms:
    """Activation terms of one block for `tokens` = s·b tokens at `act_bytes` per element.

    `fp8_inputs`: the linear layers save their input as a copy of that many bytes per element for the weight
    gradient (FP8: 1; MXFP8/NVFP4 with their block scales: toolkit.plan.cost.fp8.saved_input_bytes), as
    Transformer Engine does (performance_considerations.rst, "Activations saved for backward": BF16 keeps a
    2 MB input, FP8 a 1 MB one). It replaces the 16-bit copy where the linear layer is its only keeper — the
    QKV and MLP inputs (norm outputs), the second MLP matmul's input — and comes on top of it for the attention
    output, which the fused attention kernel keeps for its own backward ("it may lead to increased memory
    usage, if the high precision tensor also needs to be saved ... for example if it is the attention output").

    `hf_modules`: the block is HF's eager module (dstk's DeepSpeed run path), which keeps more than a fused
    runtime's block (`hf_eager_extra`), and with `dense_experts` (no expert parallelism) runs the experts as
    HF does (`routed_copies`)."""
    e, h, s = act_bytes, model.hidden_size, model.seq_length
    fp8 = fp8_inputs or e  # bytes of a saved linear-layer input
    q_width, kv_width = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    v_width, o_width = model.n_kv_heads * model.v_width, model.n_heads * model.v_width
    mask = MASK_BYTES if model.dropout else 0
    # Attention: Q and K for QKᵀ, V for the weighted sum, the input of the output projection.
    sharded = e * (q_width + kv_width) + e * v_width + e * o_width + fp8_inputs * o_width
    if model.qk_norm:  # Qwen3's per-head RMSNorm keeps its inputs (the projections' outputs) too
        sharded += e * (q_width + kv_width)
    # Softmax output (and, with dropout, its mask and dropped-out copy): b·a·s² elements, i.e. a·s per token.
    per_token_scores = model.n_heads * s
    quadratic = per_token_scores * (e + (mask + e if mask else 0))
    # The norm inputs (two; Gemma's post-norms add the attention and MLP outputs), the QKV input, the MLP
    # input, and two residual dropout masks.
    replicated = model.family.norms_per_block * e * h + fp8 * h + fp8 * h + 2 * mask * h
    if model.kv_lora_rank is not None:
        # latent attention's low-rank paths, whole on every TP rank: each latent's RMSNorm keeps its input
        # and the up projection its normalized output; the rope key shared by the heads
        replicated += 2 * e * ((model.q_lora_rank or 0) + model.kv_lora_rank) + e * (
            model.qk_rope_head_dim or 0
        )
    # of the MLP's saved tensors, the second matmul's input is that linear layer's own
    per_width = (mlp_saved(model) - 1) * e + fp8
    if moe:
        ffn, routed = model.moe_ffn_hidden_size, routed_copies(model, hf_modules and dense_experts)
        mlp = per_width * ffn * routed
        # the dispatched tokens, which the first grouped GEMM alone keeps (in FP8 runs its FP8 copy: TE's
        # GroupedLinear saves the quantized input, as a dense linear layer does; HF's experts are no linear
        # layers torchao converts), and the experts' outputs before the combine
        mlp += ((e if hf_modules else fp8) + e) * h * routed
        # Qwen2-MoE's shared expert: a dense MLP on every token, its gate's input and sigmoid
        mlp += per_width * model.shared_expert_ffn_hidden_size
    else:
        mlp = per_width * model.ffn_hidden_size
    sharded += mlp
    if hf_modules:
        extra = hf_eager_extra(model, e, moe)
        sharded, replicated, quadratic = (
            sharded + extra.sharded,
            replicated + extra.replicated,
            quadratic + extra.quadratic,
        )
    return ActivationTerms(
        sharded=sharded * tokens, replicated=replicated * tokens, quadratic=quadratic * tokens
    )


def hf_eager_extra(model: ModelSpec, e: int, moe: bool) -> ActivationTerms:
    """Bytes per token an HF eager block keeps beyond a fused runtime's (`block_terms`), read from the modules'
    source (transformers 5.x) and checked against a trace of each family (tests/test_traced.py):
    - RMSNorm (LlamaRMSNorm and its copies) keeps an fp32 copy of its input (`pow`) and the normalized value
      (`weight *`): 4 bytes more per element than a fused norm's one input, or `8 - e` more where the weight
      multiplies the fp32 value (Gemma, OLMo 2, gpt-oss: `norm_fp32_output`) — the block norms, q/k norms and
      latent attention's two low-rank norms alike;
    - SDPA keeps its output, and the output projection a transposed contiguous copy of it: one more o-wide
      tensor; eager attention keeps key and value heads repeated for every query head (`repeat_kv`);
    - Llama 4's weightless q/k L2 norm keeps fp32 inputs on its local layers; Qwen2-MoE's gated shared expert
      its output;
    - latent attention's value is a view of the up projection's output, which keeps the nope keys alive beside it,
      and Phi-3's a view of its fused q/k/v output, which keeps q and k alive beside their rotated copies;
    - a router in fp32 (DeepSeek, GLM-4.5) keeps an fp32 copy of its input;
    - eager attention (no SDPA path) keeps its softmax in fp32 beside the cast copy the weighted sum reads
      (4 bytes more per head and key), and Gemma 2's capped logits."""
    h, heads = model.hidden_size, model.n_heads
    # torch's LayerNorm keeps its input and two fp32 statistics per token, as a fused norm does
    per_element = 0 if model.norm != "rmsnorm" else (8 - e) if model.family.norm_fp32_output else 4
    replicated = per_element * model.family.norms_per_block * h
    sharded = 0.0
    if model.qk_norm:
        sharded += per_element * (heads + model.n_kv_heads) * model.head_dim
    if model.kv_lora_rank is not None:
        replicated += per_element * ((model.q_lora_rank or 0) + model.kv_lora_rank)
        sharded += e * heads * (model.head_dim - (model.qk_rope_head_dim or 0))
    qk = (heads + model.n_kv_heads) * model.head_dim
    if model.family.qk_l2_norm_local and model.n_layers:
        sharded += 4 * qk * model.n_local_layers / model.n_layers  # its fp32 inputs, on local layers only
    if model.family.sdpa:
        sharded += e * heads * model.v_width
    else:  # eager attention repeats the key/value heads for every query head and keeps the copies
        sharded += 2 * e * (heads - model.n_kv_heads) * model.head_dim
    if moe and model.family.shared_expert_gate:
        sharded += e * h  # the shared expert's output, kept for the product with its gate
    if model.family.fused_qkv and model.position_embedding == "rope":
        # Phi-3: rotary makes new q and k, and v stays a view of the fused q/k/v output, all of which it keeps
        sharded += e * (heads + model.n_kv_heads) * model.head_dim
    if moe and model.family.router_fp32:
        replicated += 4 * h
    quadratic = 0.0
    if not model.family.sdpa:
        scores = heads * model.seq_length
        quadratic = scores * (
            (4 if model.family.eager_softmax_fp32 else 0) + (e if model.family.attention_softcap else 0)
        )
    return ActivationTerms(sharded=sharded, replicated=replicated, quadratic=quadratic)


def flash_attention(model: ModelSpec, layout: LayoutRequest) -> bool:
    """Whether the attention core runs fused, never storing the a·s² scores: the layout's `flash_attention`,
    else what the runtime runs. HF modules in the DeepSpeed engine (`fused_kernels` off) run SDPA wherever the
    family has it, and SDPA's fused kernels keep q, k, v, the output and a log-sum-exp — on CUDA and on the
    CPU alike (measured: an HF GPT-2 block saves the `selective` figure, tests/test_estimate.py; a Llama at 2048
    tokens saves 1.13× it against 6× at `none`, benchmarks/sequence_parallel.py). Megatron-DeepSpeed's
    CoreAttention (`fused_kernels` on, no `--use-flash-attn-v2`) and eager attention (BLOOM) store them."""
    return runtime_flash_attention(
        model, layout.flash_attention, layout.fused_kernels, layout.precision, layout.fsdp is not None
    )


def runtime_flash_attention(
    model: ModelSpec,
    flash_attention: bool | None,
    fused_kernels: bool,
    precision: str | None = None,
    fsdp: bool = False,
) -> bool:
    """`flash_attention` when given, else the runtime's own: SDPA for HF modules (and PyTorch FSDP runs, whose
    `--fused-kernels` is torch.compile) where the family has it; Megatron-DeepSpeed's CoreAttention, except in
    fp8, where `--transformer-impl transformer_engine` builds TE's TransformerLayer, whose DotProductAttention
    runs a fused kernel (FlashAttention or cuDNN's) — as it does in the mxfp8/nvfp4 runs TE's recipes price."""
    if flash_attention is not None:
        return flash_attention
    if fused_kernels and not fsdp:
        return precision in LOW_PRECISION_GEMMS
    return model.family.sdpa


def attention_recompute(recompute: str, flash: bool) -> str:
    """The recomputation the attention core effectively gets: fused attention rebuilds its scores in backward
    by construction, so `none` behaves as `selective` there."""
    return "selective" if recompute == "none" and flash else recompute


def block_bytes(
    model: ModelSpec,
    micro_batch: int,
    act_bytes: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    moe: bool = False,
    fp8_inputs: float = 0,
    float8: str | None = None,
    hf_modules: bool = False,
    dense_experts: bool = True,
    modules: frozenset[str] = frozenset(),
) -> float:
    """Bytes one block keeps for one micro-batch on one TP rank under the given recomputation (`float8`: the
    linear layers are torchao's, `torchao_linears`; `hf_modules`: HF's eager modules, `hf_eager_extra`;
    `modules`: Megatron-Core's selectively recomputed modules, whose tensors `selective.kept_by` takes out;
    a traced block ignores them)."""
    tokens = model.seq_length * micro_batch
    if recompute == "full":
        stored = act_bytes * model.hidden_size * tokens
        return stored / tp if sequence_parallel else stored
    if model.trace is not None:
        return traced_block_bytes(model, tokens, act_bytes, recompute, moe)
    if recompute == "ops":
        # the block input, the saved matmuls' outputs, the attention output and its log-sum-exp
        saved, _ = op_sac_matmuls(model, tp, float8)
        attention = model.n_heads * model.head_dim / tp
        width = model.hidden_size + sum(out for _, out in saved) + attention
        return tokens * (act_bytes * width + SDPA_LSE_BYTES * model.n_heads / tp)
    terms = block_terms(model, tokens, act_bytes, moe, fp8_inputs, hf_modules, dense_experts)
    if recompute == "selective":
        terms = ActivationTerms(terms.sharded, terms.replicated, 0.0)
    if modules:
        sharded, replicated = kept_by(model, act_bytes, moe, modules, fp8_inputs)
        terms = ActivationTerms(
            terms.sharded - sharded * tokens, terms.replicated - replicated * tokens, terms.quadratic
        )
    return terms.per_rank(tp, sequence_parallel)


def logits_bytes(
    model: ModelSpec, micro_batch: int, act_bytes: int, tp: int, megatron: bool = False
) -> float:
    """The LM head and the loss at their peak, per s·b·V (vocabulary-parallel over TP).

    HF's loss (torch's cross-entropy): `12·s·b·V` at the start of backward — the fp32 log-softmax the
    cross-entropy saved and the two fp32 logit-gradient tensors backward creates from it, or, in bf16, the
    upcast logits beside them — measured on 2 CPU ranks for a 45M GPT-2, where this is the peak of every ZeRO
    stage. Megatron's vocabulary-parallel cross-entropy (`megatron` — Megatron-LM, Megatron-DeepSpeed and
    Megatron-Core's unfused path, megatron/core/tensor_parallel/cross_entropy.py @ d98e8a64) works in place:
    `.float()` makes the one fp32 copy beside the `act_bytes` logits, exp and the division by the sum
    overwrite it, it is the softmax saved for backward (Korthikanti et al. 2022 §4: 4·s·b·V), and backward
    writes the gradient into it before the cast back: (4 + act_bytes)·s·b·V at either peak, 4 in fp32."""
    per = (4 + act_bytes if act_bytes < 4 else 4) if megatron else 12
    return per * model.seq_length * micro_batch * model.vocab_size / tp


def _block_bytes_args(layout: Layout) -> dict:
    """`block_bytes`'s keywords that come from the layout, but the recomputation and MoE."""
    return dict(
        micro_batch=layout.micro_batch_size,
        act_bytes=layout.bytes_per_element,
        tp=layout.tp,
        sequence_parallel=layout.tp_sequence_parallel,
        fp8_inputs=saved_input_bytes(layout.fp8_recipe),
        float8=torchao_linears(layout.fp8_recipe, layout.fused_kernels),
        hf_modules=hf_modules(layout),
        dense_experts=layout.ep == 1,
        modules=layout.recomputed_modules - {"core_attn"},
    )


def hf_modules(layout: Layout) -> bool:
    """Whether the layout's blocks are HF's eager modules: dstk's DeepSpeed run path (no `--fused-kernels`,
    no PyTorch FSDP runtime)."""
    return not layout.fused_kernels and layout.fsdp is None


def _attention_mode(layout: Layout) -> str:
    """The recomputation the attention core gets: selective without `core_attn` among Megatron-Core's modules
    keeps the scores (where the kernel stores them) as no recomputation would."""
    if layout.recompute == "selective" and "core_attn" not in layout.recomputed_modules:
        return "none"
    return layout.recompute


def per_micro_activations(model: ModelSpec, layout: Layout, blocks: int, moe_blocks: int) -> float:
    """Activations one micro-batch leaves on a rank of a stage with `blocks` blocks (`moe_blocks` of them MoE)."""
    kwargs = _block_bytes_args(layout)
    recompute = attention_recompute(_attention_mode(layout), flash_attention(model, layout))
    per_micro = (blocks - moe_blocks) * block_bytes(model, recompute=recompute, **kwargs)
    per_micro += moe_blocks * block_bytes(model, recompute=recompute, moe=True, **kwargs)
    every = layout.recompute_every or 1
    if layout.recompute == "full" and every > 1 and blocks:
        # only blocks // every blocks are checkpointed; the others keep what they keep without recomputation
        kept = attention_recompute("none", flash_attention(model, layout))
        whole = (blocks - moe_blocks) * block_bytes(model, recompute=kept, **kwargs)
        whole += moe_blocks * block_bytes(model, recompute=kept, moe=True, **kwargs)
        share = (blocks // every) / blocks
        per_micro = share * per_micro + (1 - share) * whole
    return per_micro


def stage_activations(
    model: ModelSpec,
    layout: Layout,
    index: int,
    blocks: int,
    moe_blocks: int,
    per_micro: float,
    head: bool | None = None,
) -> float:
    """Activations a rank of stage `index` keeps at its peak: in-flight micro-batches × its blocks, plus the
    rebuilt block of full (or op-level) recomputation, plus the logits on the stage with the LM head (`head`,
    default the last)."""
    e = layout.bytes_per_element
    total = in_flight(layout, index) * per_micro
    if layout.offload_activations and blocks:
        # the block inputs live in host memory; the device keeps the newest few (OFFLOAD_KEPT_ON_DEVICE)
        total = min(blocks, OFFLOAD_KEPT_ON_DEVICE) * per_micro / blocks
    if layout.recompute in ("full", "ops") and blocks:
        kwargs = {**_block_bytes_args(layout), "moe": moe_blocks > 0}
        # the block being rebuilt; op-level checkpointing hands back what it saved rather than rebuild it
        total += block_bytes(
            model, recompute=attention_recompute("none", flash_attention(model, layout)), **kwargs
        )
        if layout.recompute == "ops":
            total -= block_bytes(model, recompute="ops", **kwargs)
    if index == layout.pp - 1 if head is None else head:
        total += logits_bytes(model, layout.micro_batch_size, e, layout.tp, layout.megatron_stack)
    return total / layout.sp


def in_flight(layout: Layout, index: int) -> int:
    """Micro-batches whose activations stage `index` holds at once under 1F1B (Narayanan et al. 2021)."""
    return min(layout.pp - index, layout.gradient_accumulation_steps) if layout.pp > 1 else 1


def host_activations(layout: Layout, index: int, per_micro: float) -> float:
    """Offloaded block inputs a rank keeps in host memory: all of its in-flight micro-batches' (an upper
    bound: the few newest are still on the device)."""
    return in_flight(layout, index) * per_micro / layout.sp if layout.offload_activations else 0.0
