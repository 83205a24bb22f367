"""HF's state dict from a checkpoint of expert-parallel sparse blocks: their experts back into HF's fused tensors.

DeepSpeed writes a model trained with expert parallelism as the rest of the model (`mp_rank_00_model_states.pt`)
and one file per expert (`layer_{i}_expert_{j}_mp_rank_00_model_states.pt`, keys carrying the expert's global
id). Its ZeRO merge cannot read that layout (its `*_model_states.pt` glob takes the per-expert files for model
states), and the names are not HF's, in two schemes:
- dstk's own (toolkit/parallel/hf_moe.py): the sparse block is an `ExpertParallelBlock` whose `moe` holds
  DeepSpeed's MoE layer; each expert's tensors are named and shaped as HF's slice for that expert, so they
  stack back into HF's tensors, and the router is HF's, under `moe.deepspeed_moe.gate.router`;
- DeepSpeed AutoEP's (deepspeed/moe/ep_repack.py): the router under `router.gate` (and DeepSeek's
  `router.e_score_correction_bias`), the shared experts under `shared_experts`, and per expert `w1` (gate)
  and `w3` (up), [f, h], and `w2` (down), [h, f] — which go back into HF's `gate_up_proj` (gate rows first)
  and `down_proj`, transposed where HF stores them [E, h, 2f] (Llama 4).
These are the module's weights: in an fp32 run, its fp32 masters.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from toolkit.errors import UserError

_DSTK_EXPERT = re.compile(r"(.+)\.moe\.deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\.(\w+)")
_AUTOEP_EXPERT = re.compile(r"(.+)\.experts\.(w[123])\.(\d+)")


def expert_parallel_state(tag_dir: Path, model: Any, transposed: bool) -> dict[str, Any]:
    """HF's state dict for `model` (the HF module the checkpoint was trained from, on any device) from an
    expert-parallel checkpoint in `tag_dir`; `transposed`: HF keeps the fused experts [E, h, 2f] and [E, f, h]
    (ArchitectureFacts.experts_transposed)."""
    import torch

    def load(path: Path) -> dict[str, Any]:
        return torch.load(path, map_location="cpu", weights_only=False)

    rest = load(tag_dir / "mp_rank_00_model_states.pt")["module"]
    dstk: dict[str, dict[int, Any]] = {}
    autoep: dict[tuple[str, str], dict[int, Any]] = {}
    for path in tag_dir.glob("layer_*_expert_*_model_states.pt"):
        for key, value in load(path).items():
            if m := _DSTK_EXPERT.fullmatch(key):
                dstk.setdefault(f"{m[1]}.experts.{m[3]}", {})[int(m[2])] = value
            elif m := _AUTOEP_EXPERT.fullmatch(key):
                autoep.setdefault((m[1], m[2]), {})[int(m[3])] = value
            else:
                raise UserError(
                    f"--checkpoint: {path.name} holds {key!r}, not an expert of an HF sparse block"
                )
    state = _renamed(rest, model)
    for key, by_id in dstk.items():
        state[key] = torch.stack(_in_order(by_id, key, tag_dir))
    blocks = {block for block, _ in autoep}
    for block in blocks:
        gate, up, down = (_in_order(autoep[(block, w)], f"{block}.{w}", tag_dir) for w in ("w1", "w3", "w2"))
        gate_up = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up, strict=True)])
        state[f"{block}.experts.gate_up_proj"] = gate_up.transpose(1, 2) if transposed else gate_up
        stacked = torch.stack(down)
        state[f"{block}.experts.down_proj"] = stacked.transpose(1, 2) if transposed else stacked
    return state


def _in_order(by_id: dict[int, Any], key: str, tag_dir: Path) -> list[Any]:
    if sorted(by_id) != list(range(len(by_id))):
        raise UserError(f"--checkpoint: {tag_dir} lacks experts of {key}: has {sorted(by_id)}")
    return [by_id[g] for g in range(len(by_id))]


def _renamed(rest: dict[str, Any], model: Any) -> dict[str, Any]:
    """The non-expert tensors under HF's names: the router back where the HF block keeps it (`gate`, or
    `router` in gpt-oss and Llama 4), AutoEP's shared experts under the HF block's own name for them."""
    out = {}
    for key, value in rest.items():
        if ".moe.deepspeed_moe.gate.router." in key:
            block, tail = key.split(".moe.deepspeed_moe.gate.router.", 1)
            key = f"{block}.{_router_name(model, block)}.{tail}"
        elif ".router.gate." in key or key.endswith(".router.e_score_correction_bias"):
            block, tail = key.split(".router.", 1)
            key = f"{block}.{_router_name(model, block)}.{tail.removeprefix('gate.')}"
        elif ".shared_experts." in key:
            block, tail = key.split(".shared_experts.", 1)
            key = f"{block}.{_shared_name(model, block)}.{tail}"
        out[key] = value
    return out


def _router_name(model: Any, block: str) -> str:
    module = model.get_submodule(block)
    return "gate" if hasattr(getattr(module, "gate", None), "top_k") else "router"


def _shared_name(model: Any, block: str) -> str:
    module = model.get_submodule(block)
    return "shared_experts" if hasattr(module, "shared_experts") else "shared_expert"
