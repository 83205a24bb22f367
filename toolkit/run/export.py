"""Consolidate a dstk/DeepSpeed checkpoint into an HF `save_pretrained` directory (one process, CPU).

ZeRO-1/2/3 checkpoints are merged with DeepSpeed's own `get_fp32_state_dict_from_zero_checkpoint` (the
fp32 master weights, gathered from every rank's partition); a ZeRO-0 checkpoint already holds the whole
module. Only complete checkpoints (with a valid dstk manifest) are exported.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from toolkit.errors import UserError
from toolkit.plan.specs import ModelSpec
from toolkit.run.checkpoint import check, complete_tags


def export(
    spec: ModelSpec, ckpt_dir: Path, out: Path, tag: str | None = None, tokenizer: Path | None = None
) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit.run.models import hf_config

    if not ckpt_dir.is_dir():
        raise UserError(f"--checkpoint: {ckpt_dir} is not a directory")
    tag = tag or next(iter(complete_tags(ckpt_dir)), None)
    if tag is None:
        raise UserError(f"--checkpoint: {ckpt_dir} holds no complete checkpoint")
    problem = check(ckpt_dir / tag)
    if problem:
        raise UserError(f"--tag: {ckpt_dir / tag} is not a complete checkpoint: {problem}")
    if any((ckpt_dir / tag).glob("*zero_pp_rank_*optim_states.pt")):  # ZeRO-1/2/3: partitioned fp32 masters
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)
    else:
        state = torch.load(
            ckpt_dir / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False
        )["module"]
    model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k and spec.tied_embeddings}
    if set(missing) - tied or unexpected:
        raise UserError(
            f"--model: checkpoint does not match {spec.name}: missing {sorted(set(missing) - tied)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if tokenizer is not None:
        for f in Path(tokenizer).glob("*.json"):
            shutil.copy(f, out / f.name)
    return out
