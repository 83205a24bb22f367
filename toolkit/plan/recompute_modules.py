"""Megatron-Core's fine-grained recomputation (`--recompute-granularity selective --recompute-modules ...`):
the modules dstk prices, as a layout names them.

Each module is a part of the block whose outputs Megatron-Core does not keep in forward and rebuilds in
backward (TransformerConfig.recompute_modules, megatron/core/transformer/transformer_config.py @ d98e8a64;
the memory side is toolkit.plan.cost.selective.kept_by, the time side selective_replay_s there).
"""

from __future__ import annotations

from toolkit.errors import UserError

RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts")
"""In Megatron-Core's order. Its `moe` (the whole MoE layer), Mamba/GDN and hyper-connection modules dstk does
not price."""


def normal_modules(value: str | None) -> str | None:
    """`value` as Megatron-Core's comma-separated list in its order, each module once; a name dstk does not
    price is refused in one line."""
    if value is None:
        return None
    names = [n.strip() for n in value.replace(" ", ",").split(",") if n.strip()]
    bad = [n for n in names if n not in RECOMPUTE_MODULES]
    if bad or not names:
        raise UserError(
            f"--recompute-modules: {', '.join(bad) or 'nothing given'}: not a module dstk prices (one or more "
            f"of {', '.join(RECOMPUTE_MODULES)})"
        )
    return ",".join(n for n in RECOMPUTE_MODULES if n in names)


def recomputed(recompute: str, modules: str | None) -> frozenset[str]:
    """What a layout's selective recomputation rebuilds (`modules`, default the attention core); nothing for
    the other recomputations."""
    if recompute != "selective":
        return frozenset()
    return frozenset((modules or "core_attn").split(","))
