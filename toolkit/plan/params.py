"""Exact parameter counts, by component, for the decoder architectures dstk knows.

Counts follow the HF implementations module by module (a test builds each preset's HF model on the `meta`
device and compares `sum(p.numel())`). Components are kept apart because tensor, pipeline and expert
parallelism split them differently: matrices shard over TP, norms and some biases are replicated, the
embedding sits on the first pipeline stage and the head on the last, experts shard over EP.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from toolkit.plan.attention_maps import attention_maps, latent_norm_params, qk_norm_params
from toolkit.plan.specs import ModelSpec
from toolkit.plan.traced import TracedModel


@dataclass(frozen=True)
class ParamCount:
    """Parameters of one model by component; per-layer fields count one block."""

    word_embedding: int
    position_embedding: int
    embedding_norm: int
    attention_weights: int
    """q, k, v, o matrices of one block (column/row parallel under TP; latent attention's up projections)."""
    attention_replicated_weights: int
    """Latent attention's two down projections, kept whole on every TP rank (0 otherwise)."""
    attention_sharded_bias: int
    """q/k/v biases of one block (split with their column-parallel matrices)."""
    attention_replicated_bias: int
    """Output-projection bias of one block (after the row-parallel reduce: replicated)."""
    mlp_weights: int
    mlp_sharded_bias: int
    mlp_replicated_bias: int
    block_norms: int
    router: int
    """Router of one MoE block (h × E, and gpt-oss's E biases)."""
    shared_expert: int
    """The always-on shared expert of one MoE block (Qwen2-MoE's with its sigmoid gate h → 1; DeepSeek's,
    GLM-4.5's, Llama 4's without): dense, TP-split."""
    expert: int
    """One expert's MLP including biases."""
    final_norm: int
    lm_head: int
    """0 when tied to the word embedding."""
    largest_dense_leaf: int
    """Largest single module of a block outside the experts (one matrix, or a fused q/k/v): what ZeRO-3
    must gather at once, before tensor parallelism."""
    largest_expert_leaf: int
    """Largest expert module: all experts when HF fuses them (Mixtral, divisible by EP), else one expert's
    matrix."""
    fused_experts: bool
    n_layers: int
    n_moe_layers: int
    num_experts: int
    moe_top_k: int
    exact: tuple[int, int] | None = None
    """(total, active) where the components are per-block averages (a traced model's kinds): the exact counts
    the trace read off the module."""

    @property
    def dense_mlp(self) -> int:
        return self.mlp_weights + self.mlp_sharded_bias + self.mlp_replicated_bias

    @property
    def attention(self) -> int:
        return (
            self.attention_weights
            + self.attention_replicated_weights
            + self.attention_sharded_bias
            + self.attention_replicated_bias
        )

    @property
    def block_common(self) -> int:
        """Parameters every block has, dense or MoE: attention and the two norms."""
        return self.attention + self.block_norms

    @property
    def n_dense_layers(self) -> int:
        return self.n_layers - self.n_moe_layers

    @property
    def embeddings(self) -> int:
        return self.word_embedding + self.position_embedding + self.embedding_norm

    @property
    def head(self) -> int:
        return self.final_norm + self.lm_head

    @property
    def expert_total(self) -> int:
        """All expert parameters in the model (the part expert parallelism shards)."""
        return self.n_moe_layers * self.num_experts * self.expert

    @property
    def total(self) -> int:
        if self.exact is not None:
            return self.exact[0]
        blocks = self.n_layers * self.block_common + self.n_dense_layers * self.dense_mlp
        moe = self.n_moe_layers * (self.router + self.shared_expert) + self.expert_total
        return self.embeddings + blocks + moe + self.head

    @property
    def active(self) -> int:
        """Parameters one token uses: the routed top-k experts instead of all of them."""
        if self.exact is not None:
            return self.exact[1]
        return self.total - self.n_moe_layers * (self.num_experts - self.moe_top_k) * self.expert


def _mlp(hidden: int, ffn: int, gated: bool, bias: bool) -> tuple[int, int, int]:
    """(weights, column-parallel biases, row-parallel bias) of one MLP."""
    n_in = 2 if gated else 1  # gate and up projections, or the single up projection
    weights = (n_in + 1) * hidden * ffn
    return weights, (n_in * ffn if bias else 0), (hidden if bias else 0)


@lru_cache(maxsize=256)
def _largest_dense_leaf(spec: ModelSpec, q_width: int, kv_width: int) -> int:
    h = spec.hidden_size
    if spec.family.fused_qkv:
        attention = h * (q_width + 2 * kv_width)
    else:
        attention = max(m.params for m in attention_maps(spec))
    mlp = h * spec.ffn_hidden_size * (2 if spec.family.fused_gate_up else 1)
    return max(attention, mlp, h * spec.shared_expert_ffn_hidden_size)


def _largest_expert_leaf(spec: ModelSpec) -> int:
    if not spec.is_moe:
        return 0
    per_matrix = spec.hidden_size * spec.moe_ffn_hidden_size
    # transformers 5 fuses Mixtral's experts (gate_up_proj: E × 2f × h); DeepSpeed MoE keeps one module each
    if spec.family.native_moe:
        return spec.num_experts * per_matrix * (2 if spec.gated_mlp else 1)
    return per_matrix


_COUNTED: dict[int, tuple[ModelSpec, ParamCount]] = {}


def count_params(spec: ModelSpec) -> ParamCount:
    """Count every parameter of `spec` by component (see module docstring for the HF correspondence). A spec is
    frozen, so its count is kept beside it (the planner asks thousands of times per plan)."""
    held = _COUNTED.get(id(spec))
    if held is not None and held[0] is spec:
        return held[1]
    if len(_COUNTED) > 256:
        _COUNTED.clear()
    pc = _count_params(spec)
    _COUNTED[id(spec)] = (spec, pc)
    return pc


def _count_params(spec: ModelSpec) -> ParamCount:
    if spec.trace is not None:
        return _traced_count(spec.trace)
    h, d = spec.hidden_size, spec.head_dim
    q_width, kv_width = spec.n_heads * d, spec.n_kv_heads * d
    norm = 2 * h if spec.norm == "layernorm" else h
    mlp_w, mlp_sb, mlp_rb = _mlp(h, spec.ffn_hidden_size, spec.gated_mlp, spec.mlp_bias)
    ew, esb, erb = _mlp(h, spec.moe_ffn_hidden_size, spec.gated_mlp, spec.mlp_bias)
    shared = spec.shared_expert_ffn_hidden_size
    # HF's sparse blocks with a shared expert always build it (an MLP of width 0 without one), Qwen2-MoE's with
    # its h → 1 gate
    gate = h if spec.family.shared_expert_gate else 0
    shared_params = (
        sum(_mlp(h, shared, spec.gated_mlp, spec.mlp_bias)) + gate if spec.family.shared_expert else 0
    )
    maps = attention_maps(spec)
    sinks = spec.n_heads if spec.family.attention_sinks else 0  # one logit per head, split with the heads
    return ParamCount(
        word_embedding=spec.vocab_size * h,
        position_embedding=spec.max_position_embeddings * h if spec.position_embedding == "learned" else 0,
        embedding_norm=norm if spec.embedding_norm else 0,
        attention_weights=sum(m.params for m in maps if m.split != "replicated"),
        attention_replicated_weights=sum(m.params for m in maps if m.split == "replicated"),
        attention_sharded_bias=((q_width + 2 * kv_width) if spec.attention_bias else 0) + sinks,
        attention_replicated_bias=h if spec.attention_out_bias else 0,
        mlp_weights=mlp_w,
        mlp_sharded_bias=mlp_sb,
        mlp_replicated_bias=mlp_rb,
        block_norms=spec.family.norms_per_block * norm + qk_norm_params(spec) + latent_norm_params(spec),
        router=h * spec.num_experts + (spec.num_experts if spec.family.router_bias else 0),
        shared_expert=shared_params,
        expert=ew + esb + erb,
        final_norm=norm,
        lm_head=0 if spec.tied_embeddings else spec.vocab_size * h,
        largest_dense_leaf=_largest_dense_leaf(spec, q_width, kv_width),
        largest_expert_leaf=_largest_expert_leaf(spec),
        fused_experts=spec.family.native_moe,
        n_layers=spec.n_layers,
        n_moe_layers=spec.n_moe_layers,
        num_experts=spec.num_experts,
        moe_top_k=spec.moe_top_k,
    )


@lru_cache(maxsize=64)
def _traced_count(t: TracedModel) -> ParamCount:
    """A traced model's parameters as per-block components whose sums per kind are exact: what every block
    shares (the smaller of a dense block and an MoE block's non-expert part less its router) as attention and
    norms, a dense block's rest as its MLP, an MoE block's rest beside its router as its shared part."""
    dense, moe = t.kind(False), t.kind(True)
    per_dense = dense.params / dense.blocks if dense.blocks else None
    per_moe = (moe.params - moe.expert_params - moe.router_params) / moe.blocks if moe.blocks else None
    common = min(x for x in (per_dense, per_moe) if x is not None)
    small = min(common, (dense.small_params + moe.small_params) / t.n_layers)
    return ParamCount(
        word_embedding=t.word_embedding,
        position_embedding=t.position_embedding,
        embedding_norm=t.embedding_other,
        attention_weights=common - small,
        attention_replicated_weights=0,
        attention_sharded_bias=0,
        attention_replicated_bias=0,
        mlp_weights=per_dense - common if per_dense is not None else 0,
        mlp_sharded_bias=0,
        mlp_replicated_bias=0,
        block_norms=small,
        router=moe.router_params / moe.blocks if moe.blocks else 0,
        shared_expert=per_moe - common if per_moe is not None else 0,
        expert=moe.expert,
        final_norm=t.final_norm,
        lm_head=t.lm_head,
        largest_dense_leaf=max(dense.largest_tensor, moe.largest_tensor),
        largest_expert_leaf=moe.largest_expert_tensor,
        fused_experts=True,
        n_layers=t.n_layers,
        n_moe_layers=moe.blocks,
        num_experts=moe.num_experts,
        moe_top_k=moe.top_k,
        exact=(t.total_params, t.active_params),
    )


@lru_cache(maxsize=64)
def tensor_numels(spec: ModelSpec) -> tuple[int, ...]:
    """Sizes of the HF model's parameter tensors in `model.parameters()` order (tied weights once).

    DeepSpeed's ZeRO-1/2 flatten the parameters in this order and cut the flat buffer into equal partitions,
    so a rank's gradient buffer holds every tensor its range touches in full; this order lets the estimate
    say exactly how much that is.
    """
    if spec.trace is not None:
        return spec.trace.numels
    h, d, f = spec.hidden_size, spec.head_dim, spec.ffn_hidden_size
    q, kv = spec.n_heads * d, spec.n_kv_heads * d
    bias = spec.attention_bias

    def norm() -> list[int]:
        return [h, h] if spec.norm == "layernorm" else [h]

    out: list[int] = []
    if spec.family.naming != "llama":
        out.append(spec.vocab_size * h)
        out += [spec.max_position_embeddings * h] if spec.position_embedding == "learned" else []
        out += norm() if spec.embedding_norm else []
        for _ in range(spec.n_layers):
            out += norm() + [h * (q + 2 * kv)] + ([q + 2 * kv] if bias else []) + [q * h]
            out += [h] if spec.attention_out_bias else []
            out += (
                norm() + [h * f] + ([f] if spec.mlp_bias else []) + [f * h] + ([h] if spec.mlp_bias else [])
            )
        out += norm()
    else:
        out.append(spec.vocab_size * h)
        for j in range(spec.n_layers):
            out += _attention_numels(spec)
            if spec.moe_layer(j):
                out += _sparse_block_numels(spec)
            elif spec.family.fused_gate_up:
                out += [2 * h * f, f * h]
            else:
                for _ in range(3 if spec.gated_mlp else 2):
                    out += [h * f] + ([f] if spec.mlp_bias else [])
            out += norm() * spec.family.norms_per_block
        out += norm()
    if not spec.tied_embeddings:
        out.append(spec.vocab_size * h)
    return tuple(out)


def _attention_numels(spec: ModelSpec) -> list[int]:
    """One block's attention tensors in registration order: gpt-oss's sinks first; Phi-3's output projection
    before its fused q/k/v; latent attention's down projections each followed by its RMSNorm; the q/k norms
    after the projections."""
    h, d = spec.hidden_size, spec.head_dim
    q, kv = spec.n_heads * d, spec.n_kv_heads * d
    bias = spec.attention_bias
    out = [spec.n_heads] if spec.family.attention_sinks else []
    if spec.family.fused_qkv:
        out += [q * h] + ([h] if spec.attention_out_bias else []) + [h * (q + 2 * kv)]
    elif spec.kv_lora_rank is not None:
        norms = {"q_a_proj": spec.q_lora_rank, "kv_a_proj_with_mqa": spec.kv_lora_rank}
        for m in attention_maps(spec):
            out += [m.params] + ([norms[m.name]] if m.name in norms else [])
    else:
        out += [h * q] + ([q] if bias else []) + [h * kv] + ([kv] if bias else [])
        out += [h * kv] + ([kv] if bias else []) + [q * h] + ([h] if spec.attention_out_bias else [])
    if spec.qk_norm:
        out += [q, kv] if spec.family.qk_norm_full else [d, d]
    return out


def _sparse_block_numels(spec: ModelSpec) -> list[int]:
    """An HF sparse block's tensors in registration order: Mixtral, Qwen2-MoE and gpt-oss register the router
    first, Qwen3-MoE, DeepSeek, GLM-4.5 and Llama 4 the fused experts first (gpt-oss's each with its bias); the
    shared expert (gate, up, down, and Qwen2-MoE's gate) follows."""
    h, e, fe = spec.hidden_size, spec.num_experts, spec.moe_ffn_hidden_size
    fs = spec.shared_expert_ffn_hidden_size
    bias = spec.mlp_bias
    experts = [e * 2 * fe * h] + ([e * 2 * fe] if bias else []) + [e * h * fe] + ([e * h] if bias else [])
    router = [h * e] + ([e] if spec.family.router_bias else [])
    out = experts + router if spec.family.experts_before_router else router + experts
    if spec.family.shared_expert:
        out += [h * fs, h * fs, fs * h] + ([h] if spec.family.shared_expert_gate else [])
    return out


@lru_cache(maxsize=1024)
def zero_grad_partition(numels: tuple[int, ...], ranks: int) -> int:
    """Largest per-rank ZeRO-1/2 gradient buffer: the tensors each rank's flat range touches, in full
    (deepspeed/runtime/zero/stage_1_and_2.py sizes `grads_in_partition` this way), plus the last rank's
    alignment padding."""
    total = sum(numels)
    flat = -(-total // (2 * ranks)) * 2 * ranks
    part = flat // ranks
    offset, spans = 0, [0] * ranks
    for n in numels:
        first, last = offset // part, min((offset + n - 1) // part, ranks - 1)
        for r in range(first, last + 1):
            spans[r] += n
        offset += n
    spans[-1] += flat - total
    return max(spans)
