"""Megatron-LM (Megatron-Core): the `pretrain_gpt.py` arguments for a plan. No DeepSpeed JSON is involved.

Flag names, kinds and choices come from Megatron-LM's own parser, built and read at NVIDIA/Megatron-LM
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (megatron-core 0.20.0); `tests/data/megatron_lm_flags.txt` lists the ones
dstk may emit and a test parses every emitted list with them. Line references below are to that commit:
A = megatron/training/arguments.py, TC = megatron/core/transformer/transformer_config.py.

How the model maps (what `toolkit.plan.core_rules.core_model_problem` refuses cannot be written this way):
- Every shape number is explicit, no Megatron default relied on: `--ffn-hidden-size` (its default is 4h or
  the SwiGLU 8h/3 rounding, A:1320-1329), `--kv-channels` (h / heads otherwise; unused by latent attention,
  which gets the value-head width as Megatron's DeepSeek-V3 recipes pass), `--max-position-embeddings`,
  `--position-embedding-type` (default learned_absolute), `--normalization` (default LayerNorm), dropout
  (default 0.1).
- Biases: all of them is Megatron's default (`add_bias_linear`); none is `--disable-bias-linear`; q/k/v only
  (Qwen2) adds `--add-qkv-bias`. An ungated MLP with biases runs Megatron's fused bias-GeLU, which is the tanh
  approximation (GPT-2's `gelu_new`); the exact GeLU with biases needs `--no-bias-gelu-fusion`.
- Latent attention (`--multi-latent-attention`) always has its latent norms (`--qk-layernorm` builds the up
  projections as LayerNormLinear, gpt_layer_specs.py:104-114); its RoPE is Megatron's MLA default, YaRN, here
  with `--rotary-scaling-factor 1`, which is plain RoPE (Megatron's rope fusion for MLA refuses
  `--rope-type rope`, TC:3345).
- The vocabulary is the tokenizer's (a data flag, the user's, as the Megatron-DeepSpeed target leaves it);
  Megatron pads it to a multiple of 128 × TP (`--make-vocab-size-divisible-by`), said in a note when that
  changes the size dstk priced.
- MoE: `--moe-layer-freq` as a list expression with exactly the spec's MoE blocks (Megatron's integer form puts
  an MoE layer at block 0), `--moe-ffn-hidden-size`, the shared experts' total width, grouped GEMM, dropless
  (no capacity factor: Megatron's default, and what dstk prices for Megatron-Core). Routing: a softmax router
  that renormalises its top-k is Megatron's default top-k-then-softmax; one that does not, or a top-1 router,
  takes `--moe-router-pre-softmax` (TC:2662-2669 requires it for top-1); sigmoid routers take
  `--moe-router-score-function sigmoid` and, with DeepSeek-V3's correction bias, `--moe-router-enable-expert-bias`.
  Load balancing: `aux_loss` at dstk's coefficient (Megatron's default coefficient is 0, TC:875), or for
  bias-balanced routers DeepSeek-V3's sequence-wise loss at 1e-4 (DeepSeek-AI 2024, §4.2).
Values dstk's model description lacks (RoPE base, norm epsilon, a router's output scale or expert groups) come
from the HF config.json the model was read from, when there is one; otherwise a note names the flag.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from toolkit.integrations.megatron_core_run import run_args, run_notes
from toolkit.plan.layout import Layout
from toolkit.plan.specs import DEFAULT_AUX_LOSS_COEF, ClusterSpec, ModelSpec

SOURCE = (
    "NVIDIA/Megatron-LM pretrain_gpt.py @ d98e8a64ddf34856e74b24714e3bedb2f5a39553 (megatron-core 0.20.0)"
)
LABEL = "Megatron-LM d98e8a64"
"""How `dstk config` names the arguments' reference on stderr."""
SEQUENCE_AUX_LOSS_COEF = 1e-4
"""DeepSeek-V3's sequence-wise balance loss weight α beside its bias-based balancing (DeepSeek-AI 2024, §4.2)."""
VOCAB_MULTIPLE = 128
"""Megatron's `--make-vocab-size-divisible-by` default (A:2441): the vocabulary pads to a multiple of it × TP."""


def _hf(model: ModelSpec) -> dict[str, Any]:
    """The HF config.json the model was read from ({} for a preset or a dstk file)."""
    return json.loads(model.hf_config_json) if model.hf_config_json else {}


def _from_hf(model: ModelSpec, *keys: str) -> Any:
    """The first of `keys` the model's HF config sets (transformers 5 nests RoPE under `rope_parameters`)."""
    hf = _hf(model)
    for key in keys:
        for scope in (hf, hf.get("rope_parameters") or {}):
            if scope.get(key) is not None:
                return scope[key]
    return None


def moe_layer_freq(pattern: list[int]) -> str:
    """`--moe-layer-freq` for a per-block 0/1 pattern: `1` when every block is MoE, else the shortest list
    expression Megatron evaluates back to it (characters `,0-9[]()+*` only, A:245-253), such as
    `[0]*3+[1]*58` or `[0]+([0]+[1])*15`."""
    if all(pattern):
        return "1"

    def runs(bits: list[int]) -> str:
        return "+".join(f"[{k}]" + (f"*{n}" if n > 1 else "") for k, n in _run_lengths(bits))

    best = runs(pattern)
    n = len(pattern)
    for start, period in itertools.product(range(n), range(2, n // 2 + 1)):
        reps = (n - start) // period
        unit = pattern[start : start + period]
        if reps < 2 or pattern[start : start + reps * period] != unit * reps:
            continue
        parts = [runs(pattern[:start]), f"({runs(unit)})*{reps}", runs(pattern[start + reps * period :])]
        text = "+".join(p for p in parts if p)
        best = min(best, text, key=len)
    return best


def _run_lengths(bits: list[int]) -> list[tuple[int, int]]:
    return [(k, len(list(g))) for k, g in itertools.groupby(bits)]


def _network_args(model: ModelSpec, layout: Layout) -> list[str]:
    latent = model.kv_lora_rank is not None
    args = [
        "--num-layers", str(model.n_layers),
        "--hidden-size", str(model.hidden_size),
        "--ffn-hidden-size", str(model.ffn_hidden_size),
        "--num-attention-heads", str(model.n_heads),
        "--kv-channels", str(model.v_width if latent else model.head_dim),
        "--seq-length", str(model.seq_length),
        "--max-position-embeddings", str(model.max_position_embeddings),
        "--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
    ]  # fmt: skip
    if model.n_kv_heads != model.n_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.n_kv_heads)]
    if model.position_embedding == "rope":
        args += ["--position-embedding-type", "rope"]
        base = _from_hf(model, "rope_theta")
        if base is not None:
            args += ["--rotary-base", str(int(base))]
    else:
        args += ["--position-embedding-type", "learned_absolute"]
    eps = _from_hf(model, "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps")
    if eps is not None:
        args += ["--norm-epsilon", f"{eps:g}"]
    if model.gated_mlp:
        args.append("--swiglu")
    if not model.attention_bias:
        args.append("--disable-bias-linear")
    elif not model.mlp_bias:  # q/k/v biases only (core_model_problem refuses other mixes)
        args += ["--disable-bias-linear", "--add-qkv-bias"]
    elif not model.gated_mlp and model.activation == "gelu":
        args.append("--no-bias-gelu-fusion")  # the fused bias-GeLU is the tanh approximation
    if model.qk_norm or latent:
        args.append("--qk-layernorm")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    dropout = "0.1" if model.dropout else "0.0"
    args += ["--attention-dropout", dropout, "--hidden-dropout", dropout]
    if latent:
        args += ["--multi-latent-attention"]
        if model.q_lora_rank is not None:
            args += ["--q-lora-rank", str(model.q_lora_rank)]
        rope = model.qk_rope_head_dim or 0
        args += [
            "--kv-lora-rank", str(model.kv_lora_rank),
            "--qk-head-dim", str(model.head_dim - rope),
            "--qk-pos-emb-head-dim", str(rope),
            "--v-head-dim", str(model.v_width),
            "--rotary-scaling-factor", "1",
        ]  # fmt: skip
    if model.mtp_layers:
        args += ["--mtp-num-layers", str(model.mtp_layers)]
    return args


def _router_args(model: ModelSpec, layout: Layout) -> list[str]:
    facts = model.family
    args = ["--moe-router-topk", str(model.moe_top_k)]
    if facts.router_score == "sigmoid":
        args += ["--moe-router-score-function", "sigmoid"]
        if facts.router_expert_bias:
            args.append("--moe-router-enable-expert-bias")
    else:
        args += ["--moe-router-score-function", "softmax"]
        if not model.moe_renormalize or model.moe_top_k == 1:
            args.append("--moe-router-pre-softmax")
    if facts.router_expert_bias:
        args += ["--moe-router-load-balancing-type", "seq_aux_loss"]
        args += ["--moe-aux-loss-coeff", f"{SEQUENCE_AUX_LOSS_COEF:g}"]
    else:
        args += [
            "--moe-router-load-balancing-type",
            "aux_loss",
            "--moe-aux-loss-coeff",
            f"{DEFAULT_AUX_LOSS_COEF:g}",
        ]
    groups, group_topk = _from_hf(model, "n_group"), _from_hf(model, "topk_group")
    if groups and groups > 1 and group_topk:
        args += ["--moe-router-num-groups", str(groups), "--moe-router-group-topk", str(group_topk)]
    scale = _from_hf(model, "routed_scaling_factor")
    if scale is not None and scale != 1:
        args += ["--moe-router-topk-scaling-factor", f"{scale:g}"]
    if facts.router_fp32:
        args += ["--moe-router-dtype", "fp32"]
    if layout.moe_routing == "balanced":
        args.append("--moe-router-force-load-balancing")
    return args


def _moe_args(model: ModelSpec, layout: Layout) -> list[str]:
    if not model.is_moe:
        return []
    pattern = [int(model.moe_layer(j)) for j in range(model.n_layers)]
    args = [
        "--num-experts", str(model.num_experts),
        "--moe-layer-freq", moe_layer_freq(pattern),
        "--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size),
        "--moe-grouped-gemm",
    ]  # fmt: skip
    if model.shared_expert_ffn_hidden_size:
        args += ["--moe-shared-expert-intermediate-size", str(model.shared_expert_ffn_hidden_size)]
        if model.family.shared_expert_gate:
            args.append("--moe-shared-expert-gate")
    args += _router_args(model, layout)
    # the etp-less layout is DeepSpeed's MoE, the folding with ETP 1 at tp = sp = 1 (core_rules refuses others)
    args += ["--expert-model-parallel-size", str(layout.ep)]
    args += ["--expert-tensor-parallel-size", str(layout.etp or 1)]
    dispatcher = layout.moe_dispatcher or "alltoall"
    if dispatcher in ("deepep", "hybridep"):
        args += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", dispatcher]
    else:
        args += ["--moe-token-dispatcher-type", dispatcher]
    if layout.ep_comm_overlap:
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    return args


def megatron_core_args(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, cfg: dict[str, Any]
) -> list[str]:
    """`pretrain_gpt.py` arguments for the plan; `cfg` is the plan's DeepSpeed config, read for the optimizer and
    schedule numbers only (module docstring)."""
    return _network_args(model, layout) + _moe_args(model, layout) + run_args(model, layout, cfg)


def notes(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> list[str]:
    """What the user must know or add, one line each (stderr): values the model description lacks, the
    vocabulary padding, the launcher's environment."""
    out = []
    missing = []
    if model.position_embedding == "rope" and _from_hf(model, "rope_theta") is None:
        missing.append("--rotary-base (Megatron's default 10000)")
    if _from_hf(model, "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps") is None:
        missing.append("--norm-epsilon (Megatron's default 1e-5)")
    if (
        model.is_moe
        and model.family.router_score == "sigmoid"
        and _from_hf(model, "routed_scaling_factor") is None
    ):
        missing.append("--moe-router-topk-scaling-factor (the router's output scale, e.g. DeepSeek-V3's 2.5)")
    if missing:
        out.append(f"{model.name}'s description does not say; add the model's own: {', '.join(missing)}")
    multiple = VOCAB_MULTIPLE * layout.tp
    padded = -(-model.vocab_size // multiple) * multiple
    if padded != model.vocab_size:
        out.append(
            f"Megatron pads the tokenizer's vocabulary to a multiple of {VOCAB_MULTIPLE} × tp({layout.tp}): "
            f"{model.vocab_size:,} → {padded:,} rows (dstk priced {model.vocab_size:,})"
        )
    return out + run_notes(cluster, layout)
