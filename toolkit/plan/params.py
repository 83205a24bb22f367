"""Exact parameter counts, by component, for the decoder architectures dstk knows.

Counts follow the HF implementations module by module (a test builds each preset's HF model on the `meta`
device and compares `sum(p.numel())`). Components are kept apart because tensor, pipeline and expert
parallelism split them differently: matrices shard over TP, norms and some biases are replicated, the
embedding sits on the first pipeline stage and the head on the last, experts shard over EP.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from toolkit.plan.specs import ModelSpec


@dataclass(frozen=True)
class ParamCount:
    """Parameters of one model by component; per-layer fields count one block."""

    word_embedding: int
    position_embedding: int
    embedding_norm: int
    attention_weights: int
    """q, k, v, o matrices of one block (column/row parallel under TP)."""
    attention_sharded_bias: int
    """q/k/v biases of one block (split with their column-parallel matrices)."""
    attention_replicated_bias: int
    """Output-projection bias of one block (after the row-parallel reduce: replicated)."""
    mlp_weights: int
    mlp_sharded_bias: int
    mlp_replicated_bias: int
    block_norms: int
    router: int
    """Gate of one MoE block (h × E, no bias)."""
    shared_expert: int
    """Qwen2-MoE's always-on shared expert of one MoE block, with its sigmoid gate (h → 1): dense, TP-split."""
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

    @property
    def dense_mlp(self) -> int:
        return self.mlp_weights + self.mlp_sharded_bias + self.mlp_replicated_bias

    @property
    def attention(self) -> int:
        return self.attention_weights + self.attention_sharded_bias + self.attention_replicated_bias

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
        blocks = self.n_layers * self.block_common + self.n_dense_layers * self.dense_mlp
        moe = self.n_moe_layers * (self.router + self.shared_expert) + self.expert_total
        return self.embeddings + blocks + moe + self.head

    @property
    def active(self) -> int:
        """Parameters one token uses: the routed top-k experts instead of all of them."""
        return self.total - self.n_moe_layers * (self.num_experts - self.moe_top_k) * self.expert


def _mlp(hidden: int, ffn: int, gated: bool, bias: bool) -> tuple[int, int, int]:
    """(weights, column-parallel biases, row-parallel bias) of one MLP."""
    n_in = 2 if gated else 1  # gate and up projections, or the single up projection
    weights = (n_in + 1) * hidden * ffn
    return weights, (n_in * ffn if bias else 0), (hidden if bias else 0)


@lru_cache(maxsize=256)
def _largest_dense_leaf(spec: ModelSpec, q_width: int, kv_width: int) -> int:
    h = spec.hidden_size
    attention = h * (q_width + 2 * kv_width) if spec.family.fused_qkv else h * max(q_width, kv_width)
    return max(attention, h * spec.ffn_hidden_size, h * spec.shared_expert_ffn_hidden_size)


def _largest_expert_leaf(spec: ModelSpec) -> int:
    if not spec.is_moe:
        return 0
    per_matrix = spec.hidden_size * spec.moe_ffn_hidden_size
    # transformers 5 fuses Mixtral's experts (gate_up_proj: E × 2f × h); DeepSpeed MoE keeps one module each
    if spec.family.native_moe:
        return spec.num_experts * per_matrix * (2 if spec.gated_mlp else 1)
    return per_matrix


@lru_cache(maxsize=256)
def _largest_leaf(spec: ModelSpec, q_width: int, kv_width: int) -> int:
    h = spec.hidden_size
    attention = h * (q_width + 2 * kv_width) if spec.family.fused_qkv else h * max(q_width, kv_width)
    mlp = h * spec.ffn_hidden_size * (2 if spec.gated_mlp and spec.family.native_moe else 1)
    if spec.is_moe:
        n_in = 2 if spec.gated_mlp else 1
        # transformers 5 fuses Mixtral's experts into one module; DeepSpeed MoE keeps one module per expert
        per_expert = n_in * h * spec.moe_ffn_hidden_size
        mlp = max(mlp, spec.num_experts * per_expert if spec.family.native_moe else per_expert)
    return max(attention, mlp)


def count_params(spec: ModelSpec) -> ParamCount:
    """Count every parameter of `spec` by component (see module docstring for the HF correspondence)."""
    h, d = spec.hidden_size, spec.head_dim
    q_width, kv_width = spec.n_heads * d, spec.n_kv_heads * d
    norm = 2 * h if spec.norm == "layernorm" else h
    mlp_w, mlp_sb, mlp_rb = _mlp(h, spec.ffn_hidden_size, spec.gated_mlp, spec.mlp_bias)
    ew, esb, erb = _mlp(h, spec.moe_ffn_hidden_size, spec.gated_mlp, spec.mlp_bias)
    shared = spec.shared_expert_ffn_hidden_size
    # HF's Qwen2-MoE block always builds the shared expert and its h → 1 gate (an MLP of width 0 without one)
    shared_params = (
        sum(_mlp(h, shared, spec.gated_mlp, spec.mlp_bias)) + h if spec.family.shared_expert else 0
    )
    return ParamCount(
        word_embedding=spec.vocab_size * h,
        position_embedding=spec.max_position_embeddings * h if spec.position_embedding == "learned" else 0,
        embedding_norm=norm if spec.embedding_norm else 0,
        attention_weights=h * (q_width + 2 * kv_width) + q_width * h,
        attention_sharded_bias=(q_width + 2 * kv_width) if spec.attention_bias else 0,
        attention_replicated_bias=h if spec.attention_out_bias else 0,
        mlp_weights=mlp_w,
        mlp_sharded_bias=mlp_sb,
        mlp_replicated_bias=mlp_rb,
        block_norms=spec.family.norms_per_block * norm + (2 * d if spec.qk_norm else 0),
        router=h * spec.num_experts,
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
def tensor_numels(spec: ModelSpec) -> tuple[int, ...]:
    """Sizes of the HF model's parameter tensors in `model.parameters()` order (tied weights once).

    DeepSpeed's ZeRO-1/2 flatten the parameters in this order and cut the flat buffer into equal partitions,
    so a rank's gradient buffer holds every tensor its range touches in full; this order lets the estimate
    say exactly how much that is.
    """
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
            out += [h * q] + ([q] if bias else []) + [h * kv] + ([kv] if bias else [])
            out += [h * kv] + ([kv] if bias else []) + [q * h] + ([h] if spec.attention_out_bias else [])
            out += [d, d] if spec.qk_norm else []
            if spec.is_moe and (j + 1) % spec.moe_layer_interval == 0:
                out += _sparse_block_numels(spec)
            else:
                for _ in range(3 if spec.gated_mlp else 2):
                    out += [h * f] + ([f] if spec.mlp_bias else [])
            out += norm() * spec.family.norms_per_block
        out += norm()
    if not spec.tied_embeddings:
        out.append(spec.vocab_size * h)
    return tuple(out)


def _sparse_block_numels(spec: ModelSpec) -> list[int]:
    """An HF sparse block's tensors in registration order: Mixtral and Qwen2-MoE register the router first,
    Qwen3-MoE the fused experts first; Qwen2-MoE's shared expert (gate, up, down) and its gate follow."""
    h, e, fe = spec.hidden_size, spec.num_experts, spec.moe_ffn_hidden_size
    fs = spec.shared_expert_ffn_hidden_size
    experts = [e * 2 * fe * h, e * h * fe]
    out = [*experts, h * e] if spec.family.experts_before_router else [h * e, *experts]
    return out + ([h * fs, h * fs, fs * h, h] if spec.family.shared_expert else [])


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
