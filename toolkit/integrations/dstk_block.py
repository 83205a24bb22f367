"""Recover the layout a DeepSpeed config encodes: from dstk's own `dstk.layout` block when dstk wrote it,
otherwise from the DeepSpeed keys of a user's config (so `dstk train` also runs hand-written configs)."""

from __future__ import annotations

from typing import Any

from toolkit.errors import UserError
from toolkit.plan.layout import Layout, data_parallel_size


def layout_from_config(cfg: dict[str, Any], world_size: int) -> Layout:
    block = (cfg.get("dstk") or {}).get("layout")
    if block:
        layout = Layout(**block)
        if layout.world_size != world_size:
            raise UserError(
                f"--config: planned for world size {layout.world_size} but launched on {world_size} ranks; "
                "regenerate it with dstk config for this cluster"
            )
        return layout
    zero = cfg.get("zero_optimization") or {}
    tp = (cfg.get("tensor_parallel") or {}).get("autotp_size") or 1
    pp = (cfg.get("pipeline") or {}).get("stages", 1)
    pp = pp if isinstance(pp, int) else 1
    sp = cfg.get("sequence_parallel_size", 1) or 1
    dp = data_parallel_size(world_size, tp, pp, sp)
    micro = cfg.get("train_micro_batch_size_per_gpu")
    gas = cfg.get("gradient_accumulation_steps") or 1
    if not micro:
        raise UserError("--config: train_micro_batch_size_per_gpu is required")
    precision = (
        "bf16"
        if (cfg.get("bf16") or {}).get("enabled")
        else "fp16"
        if (cfg.get("fp16") or {}).get("enabled")
        else "fp32"
    )
    return Layout(
        zero_stage=int(zero.get("stage", 0)),
        tp=tp,
        pp=pp,
        sp=sp,
        micro_batch_size=micro,
        gradient_accumulation_steps=gas,
        global_batch_size=micro * gas * dp,
        dp=dp,
        world_size=world_size,
        precision=precision,
        recompute="full" if cfg.get("activation_checkpointing") else "none",
        offload_optimizer=(zero.get("offload_optimizer") or {}).get("device", "none"),
        offload_param=(zero.get("offload_param") or {}).get("device", "none"),
    )
