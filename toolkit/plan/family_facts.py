"""The kinds of facts `plan/architectures.py`'s tables hold: what dstk knows about an HF architecture family and
about an MLP activation, as far as planning, config generation and the run path care.

Standard library only: `dstk plan` imports this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class ArchitectureFacts:
    """One HF architecture family, as far as planning, config generation and the run path care."""

    name: str
    hf_prefix: str
    """Class-name prefix in transformers (`{prefix}DecoderLayer`, `{prefix}RotaryEmbedding`)."""
    defaults: Mapping[str, Any]
    """ModelSpec field defaults that follow from the family, as its HF config class sets them."""
    block_prefix: str
    """State-dict prefix of the decoder blocks (`{block_prefix}N.`)."""
    fused_qkv: bool
    """q, k and v are one linear map (GPT-2's `c_attn`, BLOOM's `query_key_value`): fewer, larger modules."""
    residual_outputs: tuple[str, str]
    """The attention and MLP output projections, whose zeroing makes a new block an identity (growth)."""
    lora_targets: tuple[str, ...]
    autotp: bool
    pipeline: bool
    sdpa: bool
    ulysses: bool
    """DeepSpeed-Ulysses sequence parallelism can wrap the family's attention (`--sp`)."""
    native_moe: bool
    naming: Literal["gpt2", "bloom", "llama", "hf"]
    """Module-naming scheme of a block (GPT-2's `c_attn`/`c_fc`, BLOOM's `query_key_value`, Llama's `q_proj`;
    `hf`: whatever the traced model's modules are called): what state-dict surgery, LoRA shapes and pipeline
    stages are written against."""
    conv1d: bool = False
    """Linear weights stored (in, out) as transformers' Conv1D (GPT-2); peft needs `fan_in_fan_out`."""
    shared_expert: bool = False
    """The HF sparse block holds an always-on shared expert beside the routed ones (Qwen2-MoE, DeepSeek,
    GLM-4.5, Llama 4): a gated MLP of `shared_expert_ffn_hidden_size`, built even at width 0."""
    shared_expert_as_wide_as_experts: bool = False
    """The shared expert is built as wide as a routed expert (Llama 4: both `intermediate_size`)."""
    shared_expert_gate: bool = False
    """The shared expert's output passes a sigmoid gate h → 1 (Qwen2-MoE's `shared_expert_gate`)."""
    router_bias: bool = False
    """The router is a linear layer with a bias (gpt-oss), E more parameters per sparse block."""
    attention_sinks: bool = False
    """Each head has a learned sink logit its softmax normalises against (gpt-oss's `sinks`): n_heads
    parameters per block, and no SDPA path in transformers."""
    qk_norm_full: bool = False
    """q/k RMSNorm over the whole projection (OLMo 2: widths n_heads·d and n_kv_heads·d) instead of per head."""
    fused_gate_up: bool = False
    """The MLP's gate and up projections are one linear map (Phi-3's `gate_up_proj`)."""
    latent_attention: bool = False
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values through low-rank projections
    (`q_lora_rank`, `kv_lora_rank`), q/k heads of nope + rope width, v heads of `v_head_dim`."""
    norm_fp32_output: bool = False
    """HF's eager RMSNorm multiplies its weight into the fp32 normalized value (Gemma, OLMo 2, gpt-oss) and so
    keeps it in fp32 for backward, where Llama's keeps it cast back to the input's dtype."""
    router_score: Literal["softmax", "sigmoid"] = "softmax"
    """How the HF router scores experts: a softmax over all of them (Mixtral, Qwen-MoE, DeepSeek-V2; with
    `moe_renormalize` the top-k weights are renormalised, which is a softmax over the top-k logits), or a sigmoid
    per expert (DeepSeek-V3, GLM-4.5, Llama 4)."""
    router_expert_bias: bool = False
    """The router picks experts by score plus a per-expert bias that balancing updates outside the gradient, and
    weights them by the scores alone (DeepSeek-V3's and GLM-4.5's `e_score_correction_bias`; DeepSeek-AI 2024,
    §2.1.2 "auxiliary-loss-free load balancing")."""
    router_fp32: bool = False
    """The HF router computes its logits in fp32 from an fp32 copy of its input (DeepSeek, GLM-4.5), which
    autograd keeps."""
    attention_softcap: bool = False
    """Eager attention caps its logits with tanh (Gemma 2), keeping the capped scores too."""
    eager_softmax_fp32: bool = True
    """HF's eager attention takes its softmax in fp32 and keeps that output (gpt-oss's, over the sinks, stays in
    the model's dtype)."""
    qk_l2_norm_local: bool = False
    """Llama 4's rotary (local) layers L2-normalise q and k without weights (`Llama4TextL2Norm`), in fp32."""
    hf_dense_experts: bool = False
    """HF's sparse block runs every expert on every token and zeroes what the router did not pick (Llama 4's
    `Llama4TextMoe`): dstk's HF run path computes that at ep = 1; with expert parallelism its DeepSpeed layer
    dispatches the top-k."""
    expert_parallel: Literal["dstk", "autoep"] = "dstk"
    """Who makes expert parallelism of the HF sparse block (`--ep`): dstk's own conversion into DeepSpeed's MoE
    layer routed by HF's router (toolkit/parallel/hf_moe.py), or DeepSpeed's AutoEP (`expert_parallel` in the
    config; deepspeed/module_inject/auto_ep*.py), where it runs on transformers 5 without patching either
    library: DeepSeek-V2/V3 by their presets, Llama 4 by AutoEP's custom keys (`autoep_keys`). AutoEP shards the
    fused experts itself, at ZeRO-1/2/3. Measured against HF's own blocks on 2 gloo ranks (EP 2 = EP 1 = plain
    HF to 1e-7; docs/troubleshooting.md)."""
    autoep_keys: Mapping[str, Any] | None = None
    """Keys of AutoEP's custom preset for a family it has no preset for (module patterns, scoring)."""
    autoep_returns_tuple: bool = False
    """The HF decoder layer unpacks its sparse block's output as (hidden, router logits) (Llama 4); AutoEP's
    layer returns the hidden states alone, so a forward hook on it returns the pair."""
    experts_transposed: bool = False
    """HF stores the fused experts [E, h, 2f] and [E, f, h] (gpt-oss, Llama 4), not [E, 2f, h] and [E, h, f]."""
    moe_module: str = "mlp"
    """Name of a block's MLP or sparse block (Llama 4: `feed_forward`)."""
    router_module: str = "gate"
    """Name of the sparse block's router (gpt-oss, Llama 4: `router`)."""
    experts_before_router: bool = False
    """The HF sparse block registers its fused experts before its router (Qwen3-MoE): the flat order ZeRO-1/2
    partition."""
    hf_model_type: str = ""
    """HF `model_type` when it is not the family's name (Gemma 3's text-only model is `gemma3_text`)."""
    norms_per_block: int = 2
    """Norms in one block: 2 (pre-norm before attention and MLP), 4 with Gemma's post-norms after each."""
    local_attention: bool = False
    """The HF model has sliding-window layers (`sliding_window` and a layer pattern in its config)."""
    embedding_scale: bool = False
    """HF multiplies the word embeddings by √h inside the embedding module (Gemma): a pipeline stage built from
    a plain `nn.Embedding` would lose it, and a wider model scales them differently (no width growth)."""

    @property
    def model_type(self) -> str:
        """The `model_type` of the family's HF config (`AutoConfig.for_model`'s key)."""
        return self.hf_model_type or self.name

    @property
    def attention_implementation(self) -> str:
        """What the run path asks transformers for: fused SDPA wherever the family has it."""
        return "sdpa" if self.sdpa else "eager"

    @property
    def linears_per_block(self) -> int:
        """Linear modules in one dense block, each a separate ZeRO-3 gather: qkv, out and two MLP maps with a
        fused qkv; q, k, v, o and gate/up/down otherwise."""
        return 4 if self.fused_qkv else 7


@dataclass(frozen=True)
class ActivationFacts:
    """One MLP activation as HF computes it, for the cost model's memory-bound passes and saved tensors."""

    kernels: int
    """Elementwise kernels it launches forward."""
    passes: int
    """Tensor passes (reads + writes, in units of the MLP width) those kernels make forward."""
    saved: int
    """Tensors of the MLP's inner width autograd keeps in an ungated MLP."""
    gated_saved: int = 4
    """... in a gated MLP, the fused gate/up output counting as two: gate, up, act(gate) and their product for
    SwiGLU and GeGLU; gpt-oss's clamped SwiGLU (`clamp`, `gate·σ(α·gate)`, `(up + 1)·glu`) seven."""
