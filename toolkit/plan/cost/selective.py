"""What Megatron-Core's selective recomputation of named modules (`--recompute-modules`,
toolkit/plan/recompute_modules.py) changes: the tensors a block no longer keeps, and the forward work it
repeats in backward. Read from megatron/core/transformer/transformer_layer.py, moe/experts.py and
multi_latent_attention.py @ d98e8a64: each module runs under a checkpoint that discards its output after
its consumer has saved what it needs, and rebuilds it before that consumer's backward."""

from __future__ import annotations

from toolkit.plan.architectures import ACTIVATIONS
from toolkit.plan.attention_maps import attention_maps
from toolkit.plan.cost.attention import attention_core_s
from toolkit.plan.cost.fp8 import Fp8Gemms, Linear
from toolkit.plan.cost.gemm import linear_s
from toolkit.plan.cost.moe import ExpertPlacement, expert_rows, routed_copies
from toolkit.plan.specs import ClusterSpec, ModelSpec


def mlp_saved(model: ModelSpec) -> int:
    """Tensors of the MLP's inner width autograd keeps: a gated MLP gate, up, act(gate) and their product, 4
    (gpt-oss's clamped SwiGLU 7); an ungated one what `plan/architectures.py`'s ACTIVATIONS says (a fused GeLU
    its input and the second matmul's input, 2; HF GPT-2's eight-op `gelu_new` 5)."""
    facts = ACTIVATIONS[model.activation]
    return facts.gated_saved if model.gated_mlp else facts.saved


def mlp_act_passes(model: ModelSpec) -> int:
    """Passes over the MLP's inner width its activation makes per token (ACTIVATIONS), and for a gated MLP
    the product with the up projection (read two, write one)."""
    return ACTIVATIONS[model.activation].passes + (3 if model.gated_mlp else 0)


def _separate_norms(model: ModelSpec, moe: bool) -> int:
    """Norms of a block that are modules of their own, which `layernorm` recomputes: the one before an MoE
    layer's router, and latent attention's input norm; the others are fused into TE's LayerNormLinear."""
    return (1 if moe else 0) + (1 if model.kv_lora_rank is not None else 0)


def kept_by(
    model: ModelSpec, act_bytes: int, moe: bool, modules: frozenset[str], fp8_inputs: float = 0
) -> tuple[float, float]:
    """(TP-sharded, replicated) bytes per token of `activations.block_terms` that recomputing `modules` does
    not keep: `layernorm` the outputs of the norms that are modules of their own — before an MoE layer's
    router and experts, and latent attention's input norm; the other norms are fused into their linear layer
    (TE's LayerNormLinear) and stay — `moe_act` the experts' second grouped GEMM input, `mla_up_proj` the q, k
    and v the up projections make from the latents, `mlp` a dense MLP's inner tensors, `shared_experts` a
    shared expert's. `core_attn` (the a·s² scores) is the attention's own term (`activations.block_bytes`)."""
    e, h = act_bytes, model.hidden_size
    fp8 = fp8_inputs or e  # a linear layer's saved input
    sharded = replicated = 0.0
    per_width = (mlp_saved(model) - 1) * e + fp8
    if "layernorm" in modules:
        replicated += fp8 * h * _separate_norms(model, moe)
    if "moe_act" in modules and moe:
        sharded += fp8 * model.moe_ffn_hidden_size * routed_copies(model)
    if "mla_up_proj" in modules and model.kv_lora_rank is not None:
        q_width, kv_width = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
        sharded += e * (q_width + kv_width + model.n_kv_heads * model.v_width)
    if "mlp" in modules and not moe:
        sharded += per_width * model.ffn_hidden_size
    if "shared_experts" in modules and moe:
        sharded += per_width * model.shared_expert_ffn_hidden_size
    return sharded, replicated


def selective_replay_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    modules: frozenset[str],
    m: float,
    e: int,
    tp: int,
    moe: bool,
    peak: float,
    fp8: Fp8Gemms | None,
    experts: ExpertPlacement | None,
) -> float:
    """The forward work one block repeats in backward for Megatron-Core's selectively recomputed `modules`
    other than the attention core (the tensors `kept_by` takes out), for `m` tokens
    on one rank: a norm pass (read and write h) per separate norm under `layernorm`, the experts' activation
    under `moe_act`, latent attention's up projections under `mla_up_proj`, a dense block's MLP under `mlp`
    and the shared expert under `shared_experts` (each a checkpoint of the whole module: both linear layers
    and the activation again)."""
    hbm = cluster.gpu_memory_gb_per_s * 1e9
    h, t = model.hidden_size, 0.0
    act = mlp_act_passes(model)
    n_in = 2 if model.gated_mlp else 1
    if "layernorm" in modules:
        t += 2 * e * h * m * _separate_norms(model, moe) / hbm
    if "moe_act" in modules and moe:
        p = experts or ExpertPlacement()
        t += act * e * expert_rows(model, m, p) * model.moe_ffn_hidden_size / p.etp / hbm
    if "mla_up_proj" in modules and model.kv_lora_rank is not None:
        ups = [x for x in attention_maps(model) if x.split == "column"]
        t += sum(linear_s(Linear(m, x.k, x.n / tp, x.k * x.n / tp), e, peak, cluster, fp8) for x in ups)
    for name, width, applies in (
        ("mlp", model.ffn_hidden_size, not moe),
        ("shared_experts", model.shared_expert_ffn_hidden_size, moe),
    ):
        if name in modules and applies and width:
            w = width / tp
            t += linear_s(Linear(m, h, n_in * w, h * n_in * w), e, peak, cluster, fp8)
            t += linear_s(Linear(m, w, h, w * h), e, peak, cluster, fp8)  # a checkpoint of the whole module
            t += act * e * m * w / hbm
    return t


def stage_replay_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    modules: frozenset[str],
    m: float,
    e: int,
    tp: int,
    peak: float,
    flash: bool,
    fp8: Fp8Gemms | None,
    experts: ExpertPlacement | None,
    layers: dict[bool, int],
) -> float:
    """The forward work a stage of `layers` ({moe: count}) blocks repeats in backward under selective
    recomputation of `modules`: the attention core under `core_attn` (Korthikanti et al.'s selective), the
    rest by `selective_replay_s`."""
    t = 0.0
    for moe, count in layers.items():
        if count:
            if "core_attn" in modules:
                t += count * attention_core_s(model, cluster, m, e, tp, peak, flash, moe)
            if modules - {"core_attn"}:
                t += count * selective_replay_s(model, cluster, modules, m, e, tp, moe, peak, fp8, experts)
    return t
