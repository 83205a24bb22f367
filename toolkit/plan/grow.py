"""Planning a function-preserving growth (toolkit.run.grow carries it out on the weights): which parent block
each target block copies, which grown blocks are new, which projections are zeroed, and the check that a target
shape can grow from a parent at all (whole width factors, the same architecture). Pure: no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from toolkit.errors import UserError
from toolkit.plan.specs import ModelSpec

DepthMethod = Literal["stack", "interleave"]
NewBlocks = Literal["zero-out", "copy"]
RECORD = "dstk_grow.json"

# Fields a grown model keeps from its parent (the width fields may grow by whole factors, n_layers may grow).
_KEPT = (
    "architecture",
    "vocab_size",
    "head_dim",
    "tied_embeddings",
    "gated_mlp",
    "position_embedding",
    "attention_bias",
    "attention_out_bias",
    "mlp_bias",
    "norm",
    "embedding_norm",
    "activation",
    "num_experts",
    "qk_norm",
    "sliding_window",
    "sliding_window_pattern",
)
_WIDTH = ("hidden_size", "n_heads", "n_kv_heads", "ffn_hidden_size")


@dataclass(frozen=True)
class Growth:
    """What growing `parent` into `target` does: the validated, pure half of `dstk grow`."""

    parent: ModelSpec
    target: ModelSpec
    depth_method: DepthMethod
    new_blocks: NewBlocks
    blocks: list[tuple[int, bool]]
    """Per target block: (parent block it copies, whether it is a new block)."""
    factors: dict[str, int] = field(default_factory=dict)
    """Width replication factors: res (hidden), heads (query and key/value heads alike), ffn."""

    @property
    def function_preserving(self) -> bool:
        return self.new_blocks == "zero-out" or all(not new for _, new in self.blocks)

    def describe(self) -> str:
        parts = [
            f"{j}←{src}{' (new, zero-out)' if new and self.new_blocks == 'zero-out' else ' (new, copy)' if new else ''}"
            for j, (src, new) in enumerate(self.blocks)
        ]
        width = ", ".join(f"{k}×{v}" for k, v in self.factors.items() if v > 1) or "unchanged"
        return f"blocks {', '.join(parts)}; width {width}"


def depth_map(parent_layers: int, target_layers: int, method: DepthMethod) -> list[tuple[int, bool]]:
    """(source block, is new) for each target block."""
    if method == "stack":
        return [(j % parent_layers, j >= parent_layers) for j in range(target_layers)]
    sources = [j * parent_layers // target_layers for j in range(target_layers)]
    return [(src, j > 0 and sources[j - 1] == src) for j, src in enumerate(sources)]


def _is_global(spec: ModelSpec, index: int) -> bool:
    """Block `index` attends to the whole sequence (every block, without a sliding window)."""
    return spec.sliding_window is None or (index + 1) % spec.sliding_window_pattern == 0


def plan_growth(
    parent: ModelSpec,
    target: ModelSpec,
    depth_method: DepthMethod = "stack",
    new_blocks: NewBlocks = "zero-out",
) -> Growth:
    """Validate that `target` is a growth of `parent`; every problem is reported at once, naming the field."""
    problems = []
    if parent.is_moe or target.is_moe:
        problems.append("num_experts: growing MoE models is not supported (dense models only)")
    for name in _KEPT:
        mine, theirs = getattr(target, name), getattr(parent, name)
        if mine != theirs:
            problems.append(f"{name}: {mine} differs from the parent's {theirs} (growth keeps it)")
    if (
        parent.position_embedding == "learned"
        and target.max_position_embeddings != parent.max_position_embeddings
    ):
        problems.append(
            f"max_position_embeddings: {target.max_position_embeddings} differs from the parent's "
            f"{parent.max_position_embeddings} (a learned position table is kept)"
        )
    if target.n_layers < parent.n_layers:
        problems.append(f"n_layers: {target.n_layers} is fewer than the parent's {parent.n_layers}")
    factors: dict[str, int] = {}
    for name, key in zip(_WIDTH, ("res", "heads", "kv_heads", "ffn"), strict=True):
        mine, theirs = getattr(target, name), getattr(parent, name)
        if mine % theirs:
            problems.append(
                f"{name}: {mine} is not a whole multiple of the parent's {theirs} (function-preserving width "
                "growth replicates every unit a whole number of times; norm statistics stay exact only then)"
            )
        factors[key] = max(mine // theirs, 1)
    if factors["kv_heads"] != factors["heads"]:
        problems.append(
            f"n_kv_heads: must grow by the factor n_heads grows by ({factors['heads']}), so that every query "
            "head keeps its key/value group"
        )
    factors.pop("kv_heads")
    if target.position_embedding == "alibi" and any(v > 1 for v in factors.values()):
        problems.append(
            "hidden_size: ALiBi models such as BLOOM grow in depth only (the slopes depend on the head count)"
        )
    if target.family.embedding_scale and any(v > 1 for v in factors.values()):
        problems.append(
            f"hidden_size: {target.architecture} models grow in depth only (the embeddings are scaled by √h, "
            "which a wider model changes)"
        )
    if not problems and target.n_layers == parent.n_layers and all(v == 1 for v in factors.values()):
        problems.append(f"n_layers: {target.name} has the parent's shape; nothing to grow")
    if problems:
        raise UserError("--to: " + "; ".join(problems))
    blocks = depth_map(parent.n_layers, target.n_layers, depth_method)
    moved = [
        i
        for i, (j, new) in enumerate(blocks)
        if not (new and new_blocks == "zero-out") and _is_global(target, i) != _is_global(parent, j)
    ]
    if moved:
        raise UserError(
            f"--to: target blocks {moved[:4]} would copy a parent block across the local/global layer pattern "
            f"(every {target.sliding_window_pattern}th block attends globally), which changes what it computes; "
            "use --depth-method stack with --new-blocks zero-out, or a depth that keeps the pattern"
        )
    return Growth(parent, target, depth_method, new_blocks, blocks, factors)


# ---- reading the parent -------------------------------------------------------------------------------------
