"""The HF config keys of the fine-grained MoE families: DeepSeek-V2/V3 (and Kimi K2, which ships DeepSeek-V3's
modeling code under `model_type: kimi_k2`), GLM-4.5, gpt-oss and Llama 4 — one reader and one writer each, as
in `plan/hf_keys.py`."""

from __future__ import annotations

from typing import Any

from toolkit.errors import UserError
from toolkit.plan.hf_keys import Reader, Writer, given, layer_pattern, layer_types, windowed


def _deepseek(version: int) -> Reader:
    def read(data: dict[str, Any]) -> dict[str, Any]:
        """DeepseekV2/V3Config: latent attention (q/kv low-rank, nope + rope q/k heads, v heads), routed and
        shared experts, the first `first_k_dense_replace` blocks dense and every `moe_layer_freq`-th after
        them sparse (modeling_deepseek_v3.py: `layer_idx >= first_k_dense_replace and layer_idx %
        moe_layer_freq == 0`, the same blocks as dstk's `(j + 1) % interval` for the frequency 1 all have)."""
        defaults = dict(
            n_routed_experts=256 if version == 3 else 64,
            num_experts_per_tok=8 if version == 3 else 6,
            moe_intermediate_size=2048 if version == 3 else 1407,
            n_shared_experts=1 if version == 3 else 2,
            first_k_dense_replace=3 if version == 3 else 0,
            moe_layer_freq=1,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            norm_topk_prob=version == 3,
        )
        d = given(data, defaults)
        if d["moe_layer_freq"] != 1:
            raise UserError(f"moe_layer_freq: {d['moe_layer_freq']} is not modelled; dstk reads DeepSeek's 1")
        if d.get("attention_bias"):
            raise UserError("attention_bias: latent attention with biases is not modelled; DeepSeek has none")
        rope = d["qk_rope_head_dim"]
        return dict(
            n_kv_heads=data.get("num_attention_heads", 128),
            **_read_deepseek_experts(d),
            q_lora_rank=d["q_lora_rank"],
            kv_lora_rank=d["kv_lora_rank"],
            qk_rope_head_dim=rope,
            head_dim=d["qk_nope_head_dim"] + rope,
            v_head_dim=d["v_head_dim"],
        )

    return read


def _read_deepseek_experts(d: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek's expert layout, as DeepSeek-V2/V3 and GLM-4.5 configs spell it: routed experts (or
    `num_local_experts`), top-k, the experts' width, shared experts of that width, the first dense blocks."""
    return dict(
        num_experts=d.get("num_local_experts") or d["n_routed_experts"],
        moe_top_k=d["num_experts_per_tok"],
        moe_ffn_hidden_size=d["moe_intermediate_size"],
        shared_expert_ffn_hidden_size=d["moe_intermediate_size"] * d["n_shared_experts"],
        first_dense_layers=d["first_k_dense_replace"],
        moe_renormalize=d["norm_topk_prob"],
    )


def _write_deepseek_experts(spec: Any) -> dict[str, Any]:
    """`_read_deepseek_experts`' keys from a spec."""
    return dict(
        n_routed_experts=spec.num_experts,
        num_experts_per_tok=spec.moe_top_k,
        moe_intermediate_size=spec.moe_ffn_hidden_size,
        n_shared_experts=_shared_experts(spec),
        first_k_dense_replace=spec.first_dense_layers,
        norm_topk_prob=spec.moe_renormalize,
    )


def _shared_experts(spec: Any) -> int:
    """The shared experts of a DeepSeek/GLM spec: its shared width in experts' widths."""
    shared, width = spec.shared_expert_ffn_hidden_size, spec.moe_ffn_hidden_size
    if shared % width:
        raise UserError(
            f"shared_expert_ffn_hidden_size: {shared} is not a whole number of experts of "
            f"moe_ffn_hidden_size({width}); {spec.architecture} builds n_shared_experts of that width"
        )
    return shared // width


def _write_deepseek(spec: Any) -> dict[str, Any]:
    rope = spec.qk_rope_head_dim
    return dict(
        num_key_value_heads=spec.n_heads,
        head_dim=rope,  # DeepseekV3Config's `head_dim` is its rotary width
        **_write_deepseek_experts(spec),
        q_lora_rank=spec.q_lora_rank,
        kv_lora_rank=spec.kv_lora_rank,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=spec.head_dim - rope,
        v_head_dim=spec.v_head_dim,
        # group-limited routing needs experts in groups of the source's size; a spec routes over all of them
        n_group=1,
        topk_group=1,
        topk_method="greedy",
    )


def _read_glm4_moe(data: dict[str, Any]) -> dict[str, Any]:
    """Glm4MoeConfig (GLM-4.5): DeepSeek-V3's expert layout (routed and shared experts, the first
    `first_k_dense_replace` blocks dense) with grouped-query attention, q/k norms per head when `use_qk_norm`."""
    d = given(
        data,
        dict(
            n_routed_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=1408,
            n_shared_experts=1,
            first_k_dense_replace=1,
            norm_topk_prob=True,
        ),
    )
    return dict(
        attention_bias=d.get("attention_bias", False),
        attention_out_bias=False,
        qk_norm=bool(d.get("use_qk_norm", False)),
        **_read_deepseek_experts(d),
    )


def _write_glm4_moe(spec: Any) -> dict[str, Any]:
    return dict(
        attention_bias=spec.attention_bias,
        use_qk_norm=spec.qk_norm,
        **_write_deepseek_experts(spec),
        n_group=1,
        topk_group=1,
    )


def _read_gpt_oss(data: dict[str, Any]) -> dict[str, Any]:
    """GptOssConfig: every block sparse, experts of `intermediate_size` with biases (always built), a router
    with a bias, attention with biases and per-head sinks, local (128-key) and global layers alternating."""
    d = given(data, dict(num_local_experts=128, num_experts_per_tok=4, intermediate_size=2880))
    return dict(
        num_experts=d["num_local_experts"],
        moe_top_k=d["num_experts_per_tok"],
        moe_ffn_hidden_size=d["intermediate_size"],
        ffn_hidden_size=d["intermediate_size"],
        attention_bias=d.get("attention_bias", True),
        attention_out_bias=d.get("attention_bias", True),
        mlp_bias=True,
        moe_renormalize=True,
        **windowed(data, d.get("sliding_window", 128), 2),
    )


def _write_gpt_oss(spec: Any) -> dict[str, Any]:
    if spec.moe_layer_interval != 1 or spec.first_dense_layers or not spec.mlp_bias:
        raise UserError("gpt_oss: every block is sparse with biased experts; give moe_layer_interval 1")
    return dict(
        num_local_experts=spec.num_experts,
        num_experts_per_tok=spec.moe_top_k,
        intermediate_size=spec.moe_ffn_hidden_size,
        attention_bias=spec.attention_bias,
        sliding_window=spec.sliding_window or 128,
        layer_types=layer_types(spec),
    )


def _read_llama4(data: dict[str, Any]) -> dict[str, Any]:
    """Llama4TextConfig: sparse blocks every `interleave_moe_layer_step`-th (its `moe_layers`), each with a
    shared expert of the experts' width and top-1 routing; dense blocks of `intermediate_size_mlp`; rotary
    layers attend in chunks of `attention_chunk_size`, every fourth a global NoPE layer (its q/k L2 norm has
    no weights)."""
    d = given(
        data,
        dict(
            num_local_experts=16,
            num_experts_per_tok=1,
            intermediate_size=8192,
            intermediate_size_mlp=16384,
            interleave_moe_layer_step=1,
            attention_chunk_size=8192,
            no_rope_layer_interval=4,
        ),
    )
    step, layers = d["interleave_moe_layer_step"], data.get("num_hidden_layers", 48)
    if d.get("moe_layers") is not None and list(d["moe_layers"]) != list(range(step - 1, layers, step)):
        raise UserError(
            f"moe_layers: {d['moe_layers']} is not every interleave_moe_layer_step({step})-th layer"
        )
    rope = d.get("no_rope_layers")
    pattern = d["no_rope_layer_interval"]
    if rope:
        pattern = layer_pattern(
            ["chunked_attention" if r else "full_attention" for r in rope], "no_rope_layers"
        )
    return dict(
        num_experts=d["num_local_experts"],
        moe_top_k=d["num_experts_per_tok"],
        moe_ffn_hidden_size=d["intermediate_size"],
        shared_expert_ffn_hidden_size=d["intermediate_size"],
        ffn_hidden_size=d["intermediate_size_mlp"],
        moe_layer_interval=step,
        moe_renormalize=False,
        sliding_window=d["attention_chunk_size"],
        sliding_window_pattern=pattern,
    )


def _write_llama4(spec: Any) -> dict[str, Any]:
    if spec.shared_expert_ffn_hidden_size != spec.moe_ffn_hidden_size:
        raise UserError(
            "shared_expert_ffn_hidden_size: Llama 4's shared expert is as wide as its experts "
            f"(moe_ffn_hidden_size {spec.moe_ffn_hidden_size})"
        )
    k = spec.sliding_window_pattern
    step = spec.moe_layer_interval
    return dict(
        num_local_experts=spec.num_experts,
        num_experts_per_tok=spec.moe_top_k,
        intermediate_size=spec.moe_ffn_hidden_size,
        intermediate_size_mlp=spec.ffn_hidden_size,
        interleave_moe_layer_step=step,
        moe_layers=list(range(step - 1, spec.n_layers, step)),
        attention_chunk_size=spec.sliding_window,
        no_rope_layers=[int(k == 0 or (i + 1) % k != 0) for i in range(spec.n_layers)],
        layer_types=layer_types(spec, "chunked_attention"),
    )


READERS: dict[str, Reader] = {
    "deepseek_v2": _deepseek(2),
    "deepseek_v3": _deepseek(3),
    "glm4_moe": _read_glm4_moe,
    "gpt_oss": _read_gpt_oss,
    "llama4": _read_llama4,
}

WRITERS: dict[str, Writer] = {
    "deepseek_v2": _write_deepseek,
    "deepseek_v3": _write_deepseek,
    "glm4_moe": _write_glm4_moe,
    "gpt_oss": _write_gpt_oss,
    "llama4": _write_llama4,
}

MODEL_TYPE_ALIASES = {"kimi_k2": "deepseek_v3"}
"""`model_type`s read as another family's shape: Kimi K2 ships DeepSeek-V3's modeling code under its own name."""
