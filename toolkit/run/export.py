"""Consolidate a dstk/DeepSpeed checkpoint into an HF `save_pretrained` directory (one process, CPU).

ZeRO-1/2/3 checkpoints are merged with DeepSpeed's own `get_fp32_state_dict_from_zero_checkpoint` (the
fp32 master weights, gathered from every rank's partition); a ZeRO-0 checkpoint already holds the whole
module; an expert-parallel HF MoE model is put back into HF's layout from DeepSpeed's per-expert files.
Only complete checkpoints (with a valid dstk manifest) are exported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
    # DeepSpeed MoE layers: one file per expert
    if any((ckpt_dir / tag).glob("layer_*_expert_*_model_states.pt")):
        if not spec.family.native_moe:
            raise UserError(
                f"--model: {spec.name} was trained with DeepSpeed MoE layers in place of its MLPs; HF has no "
                f"{spec.architecture} with experts to export to"
            )
        from toolkit.run.export_experts import expert_parallel_state

        state = expert_parallel_state(ckpt_dir / tag, model, spec.family.experts_transposed)
    elif any((ckpt_dir / tag).glob("*zero_pp_rank_*optim_states.pt")):  # ZeRO-1/2/3: partitioned fp32 masters
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        try:
            state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)
        except NotImplementedError as exc:  # DeepSpeed 0.19.8: AutoEP's ZeRO-3 partitions cannot be merged
            raise UserError(
                f"--checkpoint: {ckpt_dir / tag}: DeepSpeed cannot consolidate it ({str(exc).split('.')[0]}); "
                "export from a run at ZeRO-1/2, or with --ep 1"
            ) from None
    else:
        state = torch.load(
            ckpt_dir / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False
        )["module"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k and spec.tied_embeddings}
    if set(missing) - tied or unexpected:
        raise UserError(
            f"--model: checkpoint does not match {spec.name}: missing {sorted(set(missing) - tied)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    model.tie_weights()
    tok = None
    if tokenizer is not None:
        from toolkit.data.tokenizer import load_tokenizer

        tok = load_tokenizer(tokenizer)
        _special_tokens_from(tok, model)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if tok is not None:
        tok.save_pretrained(out)
    _follow_umask(out)
    return out


def _special_tokens_from(tok: Any, model: Any) -> None:
    """The ids `generate()` stops and pads on are the tokenizer's that trained the model (the HF config's
    defaults — GPT-2's 50256, clamped to the vocabulary — name an ordinary token of a locally trained one, and
    generation never stops); pad falls back to end-of-text as `dstk data prepare` packs it."""
    eos = tok.eos_token_id
    bos = tok.bos_token_id if tok.bos_token_id is not None else eos
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id = eos, bos, pad


def _follow_umask(out: Path) -> None:
    """save_pretrained writes weights through a private temporary file (mode 0600); give every file the mode
    the user's umask gives a new file, as `cp` would, so a shared model directory is readable by the group."""
    import os

    mask = os.umask(0)
    os.umask(mask)
    for path in out.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~mask)
