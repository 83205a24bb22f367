"""A traced model's description: its parameters by place, and its blocks grouped into kinds.

`describe` turns the meta-built module and the two recorded forward passes (`toolkit/run/trace_ops.py`) into
a `TracedModel` (toolkit/plan/traced.py). Without recorded passes (a forward the meta device cannot run) the
blocks are described from their structure: each `nn.Linear` as a GEMM every token passes through, each
routed-expert tensor as a grouped GEMM the router's top-k tokens pass through, one attention core from the
config's heads, and saved bytes as the inputs those linear layers and the attention core keep — said in the
description's notes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolkit.plan.traced import (
    TracedAttention,
    TracedKind,
    TracedLinear,
    TracedModel,
    config_sha256,
    transformers_version,
)
from toolkit.run.trace_ops import Gemm, Recorder, config_int

TOP_K_KEYS = (
    "num_experts_per_tok",
    "moe_topk",
    "moe_k",
    "moe_top_k",
    "top_k",
    "num_activated_experts",
    "n_activated_experts",
    "num_selected_experts",
)
"""Config keys that name the router's top-k, as HF config classes spell it."""

BF16 = 2


@dataclass
class _BlockParams:
    params: int = 0
    experts: int = 0
    router: int = 0
    small: int = 0
    largest: int = 0
    largest_expert: int = 0
    modules: int = 0


@dataclass
class _Places:
    """The model's parameters by where they sit."""

    blocks: list[_BlockParams]
    word: int = 0
    position: int = 0
    before: int = 0
    after: int = 0
    head: int = 0
    numels: list[int] = field(default_factory=list)
    num_experts: int = 1


def _num_experts(model: Any, layers: Any) -> int:
    """Experts per MoE block: the leading dimension of a fused experts module's 3-D tensors."""
    sizes = [
        p.shape[0]
        for name, p in layers.named_parameters()
        if p.dim() == 3 and ".experts." in f".{name}" and p.shape[0] > 1
    ]
    return max(sizes, default=1)


def _places(model: Any, layers: Any, hidden: int) -> _Places:
    num_experts = _num_experts(model, layers)
    owner = {id(p): i for i, layer in enumerate(layers) for p in layer.parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    embed_in, embed_out = model.get_input_embeddings(), model.get_output_embeddings()
    word = getattr(embed_in, "weight", None)
    head = getattr(embed_out, "weight", None)
    out = _Places(blocks=[_BlockParams() for _ in layers], num_experts=num_experts)
    for i, layer in enumerate(layers):
        out.blocks[i].modules = sum(
            1 for m in layer.modules() if next(m.parameters(recurse=False), None) is not None
        )
    in_blocks_yet = False
    for p in model.parameters():
        n = p.numel()
        out.numels.append(n)
        name = names.get(id(p), "")
        if id(p) in owner:
            in_blocks_yet = True
            b = out.blocks[owner[id(p)]]
            b.params += n
            b.small += n if p.dim() <= 1 else 0
            if num_experts > 1 and p.dim() >= 2 and p.shape[0] == num_experts and ".experts." in f".{name}":
                b.experts += n
                b.largest_expert = max(b.largest_expert, n)
            else:
                b.largest = max(b.largest, n)
                if num_experts > 1 and tuple(p.shape) in ((num_experts, hidden), (num_experts,)):
                    b.router += n
        elif word is not None and p is word:
            out.word += n
        elif head is not None and p is head:
            out.head += n
        elif p.dim() == 2 and p.shape[-1] == hidden and "pos" in name:
            out.position += n
        elif not in_blocks_yet:
            out.before += n
        else:
            out.after += n
    return out


def _top_k(cfg: Any) -> int | None:
    return config_int(cfg, *TOP_K_KEYS)


def describe(
    config: dict[str, Any],
    model: Any,
    layers: Any,
    runs: Sequence[Recorder] | None,
    attn: str,
    failure: str,
    seconds: float,
    width: int = BF16,
) -> TracedModel:
    """The `TracedModel` of a meta-built model and its recorded passes (or, without them, its structure);
    `width`: the bytes per element it was traced in (bf16, or fp32 where its modules insist on it)."""
    cfg = model.config
    word = getattr(model.get_input_embeddings(), "weight", None)
    hidden = config_int(cfg, "hidden_size", "n_embd", "d_model", "dim") or (
        word.shape[-1] if word is not None else 0
    )
    places = _places(model, layers, hidden)
    notes: list[str] = []
    if runs:
        blocks = [_Observed.from_runs(runs, i, BF16 / width) for i in range(len(layers))]
        if width != BF16:
            notes.append(
                f"traced in {8 * width}-bit floats (its modules insist on them): its bytes scaled to bf16"
            )
        seq = runs[-1].seq
        outside = runs[-1].blocks[None].gemms
    else:
        blocks = [_Observed.from_structure(layer, cfg, places.num_experts, hidden) for layer in layers]
        seq = 0
        outside = [Gemm(hidden, config_int(cfg, "vocab_size") or 1, 1, 1, False)]
        notes.append(
            f"its forward pass could not run on the meta device ({failure}): its FLOPs and activations are "
            "estimated from its linear layers, expert tensors and the config's attention heads, not traced"
        )
    top_k = _routed_top_k(blocks, cfg, notes)
    flops = _model_flops(blocks, outside, seq, top_k)
    kinds_of = ["moe" if any(g.experts > 1 for g in b.gemms) else "dense" for b in blocks]
    kinds = {
        kind: _kind([i for i, k in enumerate(kinds_of) if k == kind], blocks, places, top_k)
        for kind in ("dense", "moe")
        if kind in kinds_of
    }
    total = sum(places.numels)
    experts = sum(b.experts for b in places.blocks)
    active = total - (experts * (places.num_experts - top_k) / places.num_experts if top_k else 0)
    core = next((c for b in blocks for c in b.cores), None)
    heads = core.heads if core else config_int(cfg, "num_attention_heads", "n_head") or 1
    kv = core.kv_heads if core else config_int(cfg, "num_key_value_heads") or heads
    notes += _notes(kinds)
    return TracedModel(
        model_type=str(config.get("model_type")),
        transformers=transformers_version() or "?",
        config_sha256=config_sha256(config),
        hf_config=config,
        attn_implementation=attn,
        hidden_size=hidden,
        vocab_size=config_int(cfg, "vocab_size") or (word.shape[0] if word is not None else 1),
        n_layers=len(layers),
        n_heads=heads,
        n_kv_heads=kv if heads % kv == 0 else heads,
        head_dim=core.qk_head_dim if core else config_int(cfg, "head_dim") or max(1, hidden // heads),
        max_position_embeddings=config_int(cfg, "max_position_embeddings", "n_positions"),
        layer_kinds=tuple(kinds_of),
        kinds=kinds,
        word_embedding=places.word,
        position_embedding=places.position,
        embedding_other=places.before,
        final_norm=places.after,
        lm_head=places.head,
        total_params=total,
        active_params=round(active),
        numels=tuple(places.numels),
        forward_flops_per_token=flops,
        traced_seq_length=seq,
        notes=tuple(notes),
        trace_seconds=round(seconds, 2),
    )


@dataclass
class _Observed:
    """One block's figures, per token (saved bytes: linear part and per key)."""

    gemms: list[Gemm]
    tokens: list[float]
    cores: list[TracedAttention]
    other_flops: float
    saved: float
    saved_per_key: float
    elementwise: float
    kernels: float

    @classmethod
    def from_runs(cls, runs: Sequence[Recorder], i: int, scale: float = 1.0) -> _Observed:
        short, long = runs[0], runs[-1]
        s1, s2 = short.seq, long.seq
        b1, b2 = short.blocks[i], long.blocks[i]
        # saved(s) = a·s + b·s²: per token a + b·s
        per_key = max(0.0, (b2.saved_bytes / s2 - b1.saved_bytes / s1) / (s2 - s1))
        return cls(
            gemms=b2.gemms,
            tokens=[g.rows / s2 for g in b2.gemms],
            cores=b2.cores,
            other_flops=b2.other_flops / s2,
            saved=scale * max(0.0, b2.saved_bytes / s2 - per_key * s2),
            saved_per_key=scale * per_key,
            elementwise=scale * b2.elementwise_bytes / s2,
            kernels=b2.kernels,
        )

    @classmethod
    def from_structure(cls, layer: Any, cfg: Any, num_experts: int, hidden: int) -> _Observed:
        import torch

        top_k = _top_k(cfg) or 1
        gemms, tokens = [], []
        for m in layer.modules():
            if isinstance(m, torch.nn.Linear):
                gemms.append(Gemm(m.in_features, m.out_features, 1, 1, m.bias is not None))
                tokens.append(1.0)
        for name, p in layer.named_parameters():
            if num_experts > 1 and p.dim() == 3 and p.shape[0] == num_experts and ".experts." in f".{name}":
                k, n = (p.shape[2], p.shape[1]) if p.shape[2] == hidden else (p.shape[1], p.shape[2])
                gemms.append(Gemm(k, n, top_k, num_experts, False))
                tokens.append(float(top_k))
        heads = config_int(cfg, "num_attention_heads", "n_head") or 1
        kv = config_int(cfg, "num_key_value_heads") or heads
        d = config_int(cfg, "head_dim") or max(1, hidden // heads)
        cores = [TracedAttention(heads=heads, kv_heads=kv, qk_head_dim=d, v_head_dim=d)]
        inputs = sum(g.k * t for g, t in zip(gemms, tokens, strict=True))
        saved = BF16 * (inputs + 2 * heads * d + 2 * kv * d + 2 * hidden)
        return cls(gemms, tokens, cores, 0.0, saved, 0.0, 2 * saved, 4 * len(gemms))


def _routed_top_k(blocks: list[_Observed], cfg: Any, notes: list[str]) -> int:
    """The router's top-k: the config's where it names one, else what the grouped GEMMs' rows show. Where HF's
    implementation runs more experts per token than the router picks (Llama 4 runs all of them and zeroes the
    unpicked), the rows stay what HF runs (the step time of dstk's HF run path) and the top-k counts the model
    FLOPs and active parameters."""
    seen = max(
        (t for b in blocks for g, t in zip(b.gemms, b.tokens, strict=True) if g.experts > 1), default=0
    )
    if not seen:
        return 0
    configured = _top_k(cfg)
    if configured and configured < round(seen):
        notes.append(
            f"HF's implementation runs {round(seen)} experts per token where the router picks {configured}: "
            f"its step time is priced as it runs, its model FLOPs at top-{configured}"
        )
        return configured
    return round(seen)


def _model_flops(blocks: list[_Observed], outside: list[Gemm], seq: int, top_k: int) -> float:
    """Forward FLOPs per token in the MFU convention: every GEMM against a weight (routed ones over the
    router's top-k), the other products between activations, and each attention core over the keys its
    layer sees (a local layer's window), as the family table counts them."""
    total = sum(2.0 * g.k * g.n * g.rows / max(seq, 1) for g in outside)
    for b in blocks:
        total += sum(
            2.0 * g.k * g.n * (top_k if g.experts > 1 else t) for g, t in zip(b.gemms, b.tokens, strict=True)
        )
        total += b.other_flops
        for c in b.cores:
            keys = min(c.window or seq, seq) if seq else 4096
            total += 2.0 * c.heads * (c.qk_head_dim + c.v_head_dim) * keys
    return total


def _kind(idx: list[int], blocks: list[_Observed], places: _Places, top_k: int) -> TracedKind:
    """Figures of the blocks `idx` of one kind: sums for parameters, per-block averages for the rest."""
    count = len(idx)
    gemms: dict[tuple[int, int, float, int, bool], float] = defaultdict(float)
    cores: dict[TracedAttention, float] = defaultdict(float)
    for i in idx:
        for g, t in zip(blocks[i].gemms, blocks[i].tokens, strict=True):
            gemms[(g.k, g.n, round(t, 6), g.experts, g.bias)] += 1 / count
        for c in blocks[i].cores:
            cores[c] += 1 / count
    moe = any(e > 1 for (_, _, _, e, _) in gemms)
    p = [places.blocks[i] for i in idx]

    def mean(attr: str) -> float:
        return sum(getattr(blocks[i], attr) for i in idx) / count

    return TracedKind(
        blocks=count,
        params=sum(b.params for b in p),
        expert_params=sum(b.experts for b in p),
        router_params=sum(b.router for b in p),
        small_params=sum(b.small for b in p),
        param_modules=sum(b.modules for b in p) / count,
        largest_tensor=max(b.largest for b in p),
        largest_expert_tensor=max(b.largest_expert for b in p),
        linears=tuple(
            TracedLinear(k=k, n=n, tokens=t, experts=e, bias=b, count=c)
            for (k, n, t, e, b), c in gemms.items()
        ),
        attention=tuple(c.model_copy(update={"count": n}) for c, n in cores.items()),
        other_flops_per_token=mean("other_flops"),
        saved_bytes_per_token=mean("saved"),
        saved_bytes_per_token_per_key=mean("saved_per_key"),
        elementwise_bytes_per_token=mean("elementwise"),
        kernels=mean("kernels"),
        num_experts=places.num_experts if moe else 0,
        top_k=top_k if moe else 0,
    )


def _notes(kinds: dict[str, TracedKind]) -> list[str]:
    notes = []
    if any(k.other_flops_per_token > 0 for k in kinds.values()):
        notes.append(
            "products between activations outside attention (a state-space scan, a linear attention) are priced "
            "as PyTorch's reference path runs them: GEMMs at the matmul rate, the rest memory-bound"
        )
    if any(not c.fused for k in kinds.values() for c in k.attention):
        notes.append("attention runs eager (transformers has no SDPA path for it): its scores are stored")
    return notes
