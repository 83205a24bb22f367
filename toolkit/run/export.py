"""Consolidate a dstk/DeepSpeed checkpoint into an HF `save_pretrained` directory (one process, CPU).

ZeRO-1/2/3 checkpoints are merged with DeepSpeed's own `get_fp32_state_dict_from_zero_checkpoint` (the
fp32 master weights, gathered from every rank's partition); a ZeRO-0 checkpoint holds the whole module, and
in 16-bit training its fp32 masters beside it in the optimizer's state, which are what is exported
(`with_fp32_masters`); an expert-parallel HF MoE model is put back into HF's layout from DeepSpeed's
per-expert files.
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
    state = _state(spec, ckpt_dir, tag, model)
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


def _state(spec: ModelSpec, ckpt_dir: Path, tag: str, model: Any) -> dict[str, Any]:
    """The fp32 state dict of a checkpoint for HF's `model`, by how it was written."""
    import torch

    if any((ckpt_dir / tag).glob("layer_*_expert_*_model_states.pt")):  # DeepSpeed MoE: a file per expert
        if not spec.family.native_moe:
            raise UserError(
                f"--model: {spec.name} was trained with DeepSpeed MoE layers in place of its MLPs; HF has no "
                f"{spec.architecture} with experts to export to"
            )
        from toolkit.run.export_experts import expert_parallel_state

        return expert_parallel_state(ckpt_dir / tag, model, spec.family.experts_transposed)
    if any((ckpt_dir / tag).glob("*zero_pp_rank_*optim_states.pt")):  # ZeRO-1/2/3: partitioned fp32 masters
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        try:
            return get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)
        except NotImplementedError as exc:  # DeepSpeed 0.19.8: AutoEP's ZeRO-3 partitions cannot be merged
            raise UserError(
                f"--checkpoint: {ckpt_dir / tag}: DeepSpeed cannot consolidate it ({str(exc).split('.')[0]}); "
                "export from a run at ZeRO-1/2, or with --ep 1"
            ) from None
    # ZeRO-0: the whole module, and beside it the optimizer's fp32 masters
    saved = torch.load(ckpt_dir / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    return with_fp32_masters(
        saved["module"], saved.get("optimizer"), [n for n, _ in model.named_parameters()]
    )


def with_fp32_masters(module: dict[str, Any], optimizer: Any, names: list[str]) -> dict[str, Any]:
    """A ZeRO-0 checkpoint's module with each 16-bit parameter replaced by its fp32 master.

    At ZeRO-0 with bf16 (or fp16) DeepSpeed trains a 16-bit module under FP16_Optimizer or its unfused twin,
    which keep the fp32 masters the update is computed on (`fp32_groups`, one tensor per parameter, or
    `fp32_groups_flat`, one per group) and copy them, rounded, into the module after each step. The module file
    holds the rounded copy; the masters are in the optimizer's state beside it (ZeRO-1/2/3 export theirs
    through zero_to_fp32). A master belongs to the parameter whose 16-bit value it rounds to, taken in the
    module's order: that pairs them whatever the optimizer's parameter groups (MoE splits experts off), and a
    parameter without one (frozen under LoRA) keeps its module value."""
    import torch

    wide = [n for n in names if n in module and module[n].dtype in (torch.bfloat16, torch.float16)]
    if not wide or not isinstance(optimizer, dict):
        return module
    if optimizer.get("fp32_groups") is not None:
        masters = [t for group in optimizer["fp32_groups"] for t in group]
    elif optimizer.get("fp32_groups_flat") is not None:  # one group in the module's parameter order
        flat = torch.cat([g.reshape(-1) for g in optimizer["fp32_groups_flat"]])
        sizes = [module[n].numel() for n in wide]
        masters = list(torch.split(flat[: sum(sizes)], sizes)) if flat.numel() >= sum(sizes) else []
    else:
        return module
    out, free = dict(module), list(masters)
    for name in wide:
        value = module[name]
        for i, master in enumerate(free):
            if master.numel() == value.numel() and torch.equal(
                master.reshape(value.shape).to(value.dtype), value
            ):
                out[name] = free.pop(i).reshape(value.shape).float()
                break
    # a tied weight (the LM head) is the same storage under another name: it gets the same master, or loading
    # it after the embedding would put the rounded copy back
    by_storage = {module[n].untyped_storage().data_ptr(): out[n] for n in wide if out[n] is not module[n]}
    for key, value in module.items():
        if key not in names and value.untyped_storage().data_ptr() in by_storage:
            out[key] = by_storage[value.untyped_storage().data_ptr()]
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
