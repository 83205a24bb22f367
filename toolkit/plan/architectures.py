"""What dstk knows about each HF architecture family, in one table that every module reads.

A new family is one entry in `ARCHITECTURES` (plus, for a new MLP activation, one in `ACTIVATIONS`, and its HF
config keys in `hf_config.py`); the planner's rules, the cost model, the config generators and the run path ask
these tables instead of testing `architecture == "..."` themselves, and ModelSpec's `architecture` and
`activation` accept exactly their keys.

Sources, per field:
- `defaults`: the HF config classes' own defaults (GPT2Config, BloomConfig, LlamaConfig, Qwen2Config,
  Qwen2MoeConfig — `qkv_bias` on, no o_proj bias, `norm_topk_prob` off — and Qwen3MoeConfig — q/k RMSNorm,
  `norm_topk_prob` off — in transformers 5.x); a file with only the core shape names and no `architecture` is a GPT-2-style decoder.
- `autotp`: DeepSpeed 0.19.8's AutoTP training shards a model through HF's `tp_plan` or its name heuristic. The
  heuristic refuses GPT-2 ("AutoTP not supported for model. Please use kernel injection since container policy
  for model exists", module_inject/auto_tp.py) and GPT-2 has no HF tp_plan; Llama trains on 2 gloo ranks, and
  the parser accepts BLOOM, Mistral, Mixtral and Qwen2. Qwen2/3-MoE are left out until a run shows AutoTP
  splitting their fused 3-D expert tensors.
- `pipeline`: the families `toolkit/parallel/pipeline.py` can cut into a DeepSpeed PipelineModule.
- `sdpa`: transformers 5.24 has no SDPA path for BLOOM ("does not support an attention implementation through
  torch.nn.functional.scaled_dot_product_attention yet"); it runs eager attention.
- `ulysses`: DeepSpeed 0.19.8's Ulysses HF path (`UlyssesSPAttentionHF.register_with_transformers`) replaces
  the SDPA attention function and returns the attention output with its heads merged; a family's attention
  must then reshape it by the input shape, as Llama's and its relatives' do (`reshape(*input_shape, -1)`).
  GPT-2's merges the last two dimensions instead (`reshape(*shape[:-2], -1)`: "mat1 and mat2 shapes cannot
  be multiplied (4x2048 and 64x64)" on 2 gloo ranks, after DeepSpeed failed first on its config having no
  `num_key_value_heads`); BLOOM has no SDPA. Trained and checked against `--sp 1`: Llama.
- `native_moe`: Mixtral's, Qwen2-MoE's and Qwen3-MoE's experts live in the HF model (fused `gate_up_proj` E × 2f × h in transformers 5); at
  ep = 1 the block stays HF's (a ZeRO-3 leaf module), with expert parallelism dstk moves it into DeepSpeed's
  MoE layer with HF's own router (toolkit/parallel/hf_moe.py); other families become MoE through DeepSpeed's
  MoE layer, one module per expert. The engine refuses its MoE layer at stage 3.
- `lora_targets`: peft's default target modules for the family (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
- Gemma 3 (Gemma Team 2025, "Gemma 3 Technical Report", arXiv:2503.19786, §2; transformers 5.x
  `Gemma3TextConfig`, modeling_gemma3.py): GeGLU with the tanh GeLU (`gelu_pytorch_tanh`), q/k RMSNorm,
  four RMSNorms per block (pre- and post-norm around attention and MLP), embeddings scaled by √h inside
  `Gemma3TextScaledWordEmbedding`, tied LM head, local sliding-window layers with every 6th global. Its
  pipeline is off: `toolkit/parallel/pipeline.py`'s stages are a plain `nn.Embedding` (losing the √h scale)
  and one rotary embedding (Gemma 3 has a local and a global one per layer type). AutoTP (HF gives a
  `tp_plan`) and Ulysses (its attention takes a sliding-window mask) stay off until a run shows them right.

Standard library only: `dstk plan` imports this.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from toolkit.plan.family_facts import ActivationFacts, ArchitectureFacts

_LLAMA_DEFAULTS = MappingProxyType(
    dict(
        gated_mlp=True,
        position_embedding="rope",
        norm="rmsnorm",
        attention_bias=False,
        mlp_bias=False,
        tied_embeddings=False,
        embedding_norm=False,
        dropout=False,
        activation="silu",
    )
)


def _llama_like(
    name: str,
    hf_prefix: str,
    *,
    native_moe: bool = False,
    autotp: bool = True,
    pipeline: bool | None = None,
    ulysses: bool = True,
    fused_qkv: bool = False,
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj"),
    sdpa: bool = True,
    **facts_and_defaults: Any,
) -> ArchitectureFacts:
    """A family with Llama's module names (`model.layers.N.self_attn.q_proj`, `mlp.down_proj`); keywords that
    name an `ArchitectureFacts` field set that fact, the others are its ModelSpec defaults where they differ
    from Llama's. Its pipeline defaults to on for dense families (a native MoE block is one module the
    pipeline cannot cut by experts)."""
    fact_names = set(ArchitectureFacts.__dataclass_fields__)
    extra = {k: v for k, v in facts_and_defaults.items() if k in fact_names}
    overrides = {k: v for k, v in facts_and_defaults.items() if k not in fact_names}
    return ArchitectureFacts(
        name=name,
        hf_prefix=hf_prefix,
        defaults=MappingProxyType({**_LLAMA_DEFAULTS, **overrides}),
        block_prefix="model.layers.",
        fused_qkv=fused_qkv,
        residual_outputs=("self_attn.o_proj.", f"{extra.get('moe_module', 'mlp')}.down_proj."),
        lora_targets=lora_targets,
        autotp=autotp,
        pipeline=not native_moe if pipeline is None else pipeline,
        sdpa=sdpa,
        ulysses=ulysses,
        native_moe=native_moe,
        naming="llama",
        **extra,
    )


def _deepseek(name: str, hf_prefix: str, **facts_and_defaults: Any) -> ArchitectureFacts:
    """DeepSeek-V2/V3's shape: multi-head latent attention, fine-grained routed experts beside shared ones, the
    first blocks dense (DeepseekV3Config's defaults: the 671B model's widths). The HF sparse block registers
    its fused experts before its router, then the shared experts."""
    return _llama_like(
        name,
        hf_prefix,
        native_moe=True,
        autotp=False,
        ulysses=False,
        experts_before_router=True,
        shared_expert=True,
        latent_attention=True,
        router_fp32=True,
        expert_parallel="autoep",
        lora_targets=("q_a_proj", "kv_a_proj_with_mqa"),
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        v_head_dim=128,
        head_dim=192,
        **facts_and_defaults,
    )


ARCHITECTURES: Mapping[str, ArchitectureFacts] = MappingProxyType(
    {
        "gpt2": ArchitectureFacts(
            name="gpt2",
            hf_prefix="GPT2",
            defaults=MappingProxyType(
                dict(
                    gated_mlp=False,
                    position_embedding="learned",
                    norm="layernorm",
                    attention_bias=True,
                    mlp_bias=True,
                    tied_embeddings=True,
                    embedding_norm=False,
                    dropout=True,
                    activation="gelu_new",
                )
            ),
            block_prefix="transformer.h.",
            fused_qkv=True,
            residual_outputs=("attn.c_proj.", "mlp.c_proj."),
            lora_targets=("c_attn",),
            autotp=False,
            pipeline=True,
            sdpa=True,
            ulysses=False,
            native_moe=False,
            conv1d=True,
            naming="gpt2",
        ),
        "bloom": ArchitectureFacts(
            name="bloom",
            hf_prefix="Bloom",
            defaults=MappingProxyType(
                dict(
                    gated_mlp=False,
                    position_embedding="alibi",
                    norm="layernorm",
                    attention_bias=True,
                    mlp_bias=True,
                    tied_embeddings=True,
                    embedding_norm=True,
                    dropout=False,
                    activation="gelu",
                )
            ),
            block_prefix="transformer.h.",
            fused_qkv=True,
            residual_outputs=("self_attention.dense.", "mlp.dense_4h_to_h."),
            lora_targets=("query_key_value",),
            autotp=True,
            pipeline=False,
            sdpa=False,
            ulysses=False,
            native_moe=False,
            naming="bloom",
        ),
        "llama": _llama_like("llama", "Llama"),
        "mistral": _llama_like("mistral", "Mistral"),
        "mixtral": _llama_like("mixtral", "Mixtral", native_moe=True),
        "qwen2": _llama_like("qwen2", "Qwen2", attention_bias=True, attention_out_bias=False),
        "qwen2_moe": _llama_like(
            "qwen2_moe",
            "Qwen2Moe",
            native_moe=True,
            autotp=False,
            shared_expert=True,
            shared_expert_gate=True,
            attention_bias=True,
            attention_out_bias=False,
            moe_renormalize=False,
        ),
        "qwen3_moe": _llama_like(
            "qwen3_moe",
            "Qwen3Moe",
            native_moe=True,
            autotp=False,
            experts_before_router=True,
            qk_norm=True,
            moe_renormalize=False,
        ),
        "qwen3": _llama_like("qwen3", "Qwen3", autotp=False, pipeline=False, ulysses=False, qk_norm=True),
        "olmo2": _llama_like(
            "olmo2",
            "Olmo2",
            autotp=False,
            ulysses=False,
            pipeline=False,
            qk_norm=True,
            qk_norm_full=True,
            norm_fp32_output=True,
        ),
        "phi3": _llama_like(
            "phi3",
            "Phi3",
            autotp=False,
            ulysses=False,
            pipeline=False,
            fused_qkv=True,
            fused_gate_up=True,
            lora_targets=("qkv_proj",),
            local_attention=True,
        ),
        "gemma2": _llama_like(
            "gemma2",
            "Gemma2",
            autotp=False,
            pipeline=False,
            ulysses=False,
            sdpa=False,
            norms_per_block=4,
            local_attention=True,
            embedding_scale=True,
            norm_fp32_output=True,
            attention_softcap=True,
            activation="gelu_pytorch_tanh",
            tied_embeddings=True,
            sliding_window=4096,
            sliding_window_pattern=2,
        ),
        "deepseek_v2": _deepseek("deepseek_v2", "DeepseekV2"),
        "deepseek_v3": _deepseek(
            "deepseek_v3", "DeepseekV3", router_score="sigmoid", router_expert_bias=True
        ),
        "glm4_moe": _llama_like(
            "glm4_moe",
            "Glm4Moe",
            native_moe=True,
            autotp=False,
            ulysses=False,
            experts_before_router=True,
            shared_expert=True,
            router_fp32=True,
            router_score="sigmoid",
            router_expert_bias=True,
            attention_out_bias=False,  # `attention_bias` adds q/k/v biases only (Glm4MoeAttention)
            # GLM-4.5's sparse block is DeepSeek-V3's (sigmoid group-limited router with a score-correction
            # bias, shared experts), and so is its config's naming: AutoEP's DeepSeek-V3 preset runs it
            expert_parallel="autoep",
            autoep_keys=MappingProxyType(dict(preset_model="deepseek_v3")),
        ),
        "gpt_oss": _llama_like(
            "gpt_oss",
            "GptOss",
            native_moe=True,
            autotp=False,
            ulysses=False,
            sdpa=False,
            router_bias=True,
            attention_sinks=True,
            norm_fp32_output=True,
            eager_softmax_fp32=False,
            activation="gpt_oss_swiglu",
            router_module="router",
            experts_transposed=True,
            local_attention=True,
            attention_bias=True,
            attention_out_bias=True,
            mlp_bias=True,
            sliding_window=128,
            sliding_window_pattern=2,
        ),
        "llama4": _llama_like(
            "llama4",
            "Llama4",
            native_moe=True,
            autotp=False,
            ulysses=False,
            experts_before_router=True,
            shared_expert=True,
            hf_model_type="llama4_text",
            shared_expert_as_wide_as_experts=True,
            hf_dense_experts=True,
            qk_l2_norm_local=True,
            router_score="sigmoid",
            expert_parallel="autoep",
            # AutoEP has no Llama 4 preset: its custom keys, HF's sigmoid scores applied to the expert input
            autoep_keys=MappingProxyType(
                dict(
                    moe_layer_pattern=r"model\.layers\.\d+\.feed_forward",
                    router_pattern="router",
                    expert_pattern="experts",
                    score_func="sigmoid",
                    score_apply="pre",
                    route_norm=False,
                    has_shared_experts=True,
                    shared_experts_pattern="shared_expert",
                )
            ),
            autoep_returns_tuple=True,
            experts_transposed=True,
            moe_module="feed_forward",
            router_module="router",
            local_attention=True,
            sliding_window=8192,
            sliding_window_pattern=4,
        ),
        "gemma3": _llama_like(
            "gemma3",
            "Gemma3",
            autotp=False,
            pipeline=False,
            ulysses=False,
            hf_model_type="gemma3_text",
            norms_per_block=4,
            local_attention=True,
            embedding_scale=True,
            norm_fp32_output=True,
            activation="gelu_pytorch_tanh",
            tied_embeddings=True,
            qk_norm=True,
            sliding_window=4096,
            sliding_window_pattern=6,
        ),
    }
)


# HF's ACT2FN (transformers/activations.py), counted from the source. gelu_new is NewGELUActivation,
# `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` written as eight elementwise ops that keep 5 inner-width
# tensors (its input x, tanh(·), 0.5·x, 1 + tanh(·), and the output — counted with autograd's saved-tensor
# hooks on the HF module; tests/test_estimate.py); gelu, relu, silu and gelu_pytorch_tanh
# (`nn.functional.gelu(x, approximate="tanh")`, Gemma's) are one kernel that reads and writes once and keeps
# its input, beside the second matmul's input.
ACTIVATIONS: Mapping[str, ActivationFacts] = MappingProxyType(
    {
        "gelu": ActivationFacts(kernels=1, passes=2, saved=2),
        "gelu_new": ActivationFacts(kernels=8, passes=18, saved=5),
        "gelu_pytorch_tanh": ActivationFacts(kernels=1, passes=2, saved=2),
        "silu": ActivationFacts(kernels=1, passes=2, saved=2),
        "relu": ActivationFacts(kernels=1, passes=2, saved=2),
        # gpt-oss's experts (GptOssExperts._apply_gate): two clamps, α·gate, σ, the product, up + 1, the product
        "gpt_oss_swiglu": ActivationFacts(kernels=7, passes=16, saved=2, gated_saved=7),
    }
)


TRACED = ArchitectureFacts(
    name="traced",
    hf_prefix="",
    defaults=MappingProxyType(
        dict(
            gated_mlp=False,
            position_embedding="rope",
            norm="rmsnorm",
            attention_bias=False,
            mlp_bias=False,
            tied_embeddings=False,
            embedding_norm=False,
            dropout=False,
            activation="silu",
        )
    ),
    block_prefix="",
    fused_qkv=False,
    residual_outputs=("", ""),
    lora_targets=(),
    autotp=False,
    pipeline=False,
    sdpa=True,
    ulysses=False,
    native_moe=True,
    naming="hf",
)
"""A model with no table entry, described by its trace (toolkit/plan/traced.py): the HF model as transformers
builds it runs in the DeepSpeed engine with data parallelism, ZeRO 0-3 and offload; whatever needs to know its
modules by name (AutoTP, the pipeline, Ulysses, LoRA targets, growth) is refused by the rules. Its experts stay
the HF model's own (a ZeRO-3 leaf at ep = 1). `sdpa` follows what the trace found
(`ModelSpec.family`)."""


FAMILIES: Mapping[str, ArchitectureFacts] = MappingProxyType({**ARCHITECTURES, TRACED.name: TRACED})
"""The table's families and `traced`: every `architecture` a ModelSpec accepts."""


def facts(architecture: str) -> ArchitectureFacts:
    """The table entry for `architecture` (ModelSpec's Literal type has already refused any other name)."""
    return FAMILIES[architecture]


def supporting(flag: str) -> tuple[str, ...]:
    """The families whose boolean fact `flag` is true, in table order (for error messages)."""
    return tuple(name for name, f in ARCHITECTURES.items() if getattr(f, flag))
