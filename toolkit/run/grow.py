"""Grow a trained model in depth and/or width into a `save_pretrained` directory `dstk train --init-from` continues.

Depth. Target block j is a copy of a trained parent block: `stack` repeats the parent's blocks in order
(j ← j mod L, Gong et al. 2019, "Efficient Training of BERT by Progressively Stacking"), `interleave` places each
block's copies next to it (j ← ⌊j·L/L'⌋). The copies that are not the first of their source are the *new* blocks.
With `new_blocks="zero-out"` their residual-branch output projections (attention out-proj, MLP down-proj, and
their biases) are zero, so in a pre-norm decoder (x + attn(norm(x)), then + mlp(norm(x))) each new block is the
identity on the residual stream and the grown model computes exactly the parent's function (the depth operator
of Shen et al. 2022, "Staged Training for Transformer Language Models"). The zeroed projections get gradients
at the first step (their inputs are not zero), the rest of a new block from the second, once they are non-zero.
`copy` keeps plain copies, which changes the function.

Width (Net2Net, Chen et al. 2016, generalised to pre-norm transformers as in Shen et al. 2022): every residual
unit, attention head and MLP unit is replicated a whole number of times k. Producers copy their rows, so a
replicated unit carries the same value as its original; consumers divide each original input weight among its
copies, so every sum is unchanged. LayerNorm/RMSNorm of [x, x, …] equals [norm(x), norm(x), …] (same mean and
variance), which is why only integer factors are exact. A tied LM head both produces (embedding) and consumes
(logits) the residual stream, so the final norm is scaled by 1/k instead. Splitting a consumer's weights evenly
would keep the copies identical forever (equal gradients); dstk splits each weight at random (fractions drawn
with spread `width_noise`, normalised to sum to one), which keeps the function and breaks the symmetry.

The validation half, which runs before anything is loaded, is toolkit.plan.growth_map.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.plan.growth_map import (
    RECORD,
    DepthMethod,
    Growth,
    NewBlocks,
    plan_growth,
)
from toolkit.plan.specs import ModelSpec
from toolkit.run.models import hf_config


def _checkpoint_state(ckpt_dir: Path, tag: str | None) -> tuple[dict[str, Any], str]:
    """Consolidated fp32 weights of a complete dstk checkpoint (ZeRO partitions merged by DeepSpeed's
    `get_fp32_state_dict_from_zero_checkpoint`, as `dstk export` does) and its tag."""
    import torch

    from toolkit.run.checkpoint import MANIFEST, check, complete_tags

    if (ckpt_dir / MANIFEST).is_file():  # a tag directory itself
        ckpt_dir, tag = ckpt_dir.parent, tag or ckpt_dir.name
    tag = tag or next(iter(complete_tags(ckpt_dir)), None)
    if tag is None:
        raise UserError(
            f"--from: {ckpt_dir} is neither a save_pretrained directory (no config.json) nor a dstk checkpoint "
            "directory with a complete checkpoint"
        )
    problem = check(ckpt_dir / tag)
    if problem:
        raise UserError(f"--tag: {ckpt_dir / tag} is not a complete checkpoint: {problem}")
    if any((ckpt_dir / tag).glob("layer_*-model_states.pt")):
        raise UserError(f"--from: {ckpt_dir / tag} is a pipeline checkpoint; grow a ZeRO/data-parallel one")
    if any((ckpt_dir / tag).glob("*zero_pp_rank_*optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)), tag
    path = ckpt_dir / tag / "mp_rank_00_model_states.pt"
    return dict(torch.load(path, map_location="cpu", weights_only=False)["module"]), tag


def infer_parent(target: ModelSpec, state: dict[str, Any]) -> ModelSpec:
    """The parent's description from its weights' shapes, taking what shapes cannot tell (head_dim, biases,
    norms…) from `target` — exactly what growth keeps; `--from-model` overrides it."""
    from toolkit.plan.load import build

    prefix = target.family.block_prefix
    indices = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    if not indices:
        raise UserError(f"--from: no {prefix}N.* weights; is it a {target.architecture} model?")
    data = target.model_dump()
    data.update(name=f"{target.name}-parent", n_layers=max(indices) + 1)
    try:
        if target.family.naming == "gpt2":
            data["vocab_size"], data["hidden_size"] = state["transformer.wte.weight"].shape
            data["max_position_embeddings"] = state["transformer.wpe.weight"].shape[0]
            data["ffn_hidden_size"] = state[f"{prefix}0.mlp.c_fc.weight"].shape[1]
            data["n_heads"] = data["n_kv_heads"] = data["hidden_size"] // target.head_dim
        elif target.family.naming == "bloom":
            data["vocab_size"], data["hidden_size"] = state["transformer.word_embeddings.weight"].shape
        else:
            data["vocab_size"], data["hidden_size"] = state["model.embed_tokens.weight"].shape
            data["ffn_hidden_size"] = state[f"{prefix}0.mlp.up_proj.weight"].shape[0]
            data["n_heads"] = state[f"{prefix}0.self_attn.q_proj.weight"].shape[0] // target.head_dim
            data["n_kv_heads"] = state[f"{prefix}0.self_attn.k_proj.weight"].shape[0] // target.head_dim
    except KeyError as exc:
        raise UserError(
            f"--from: weights lack {exc.args[0]}; give the parent's description with --from-model"
        ) from None
    data["seq_length"] = min(target.seq_length, data.get("max_position_embeddings") or target.seq_length)
    data["moe_ffn_hidden_size"] = data.get("ffn_hidden_size")
    return build(ModelSpec, data, "--from (inferred)")


def pretrained_spec(source: Path, target: ModelSpec, from_model: ModelSpec | None) -> ModelSpec | None:
    """The description of a save_pretrained parent from its config.json (no weights read, no torch), or None
    when `source` is not one (then it must be a checkpoint directory)."""
    from toolkit.plan.load import load_model

    if not source.is_dir():
        raise UserError(f"--from: {source} is not a directory")
    if not (source / "config.json").is_file():
        return None
    if from_model is not None:
        raise UserError(
            "--from-model: only for a DeepSpeed checkpoint (a save_pretrained directory describes itself)"
        )
    spec = load_model(str(source / "config.json"), {"name": source.name})
    if spec.position_embedding != "learned" or target.seq_length <= spec.max_position_embeddings:
        spec = spec.model_copy(update={"seq_length": target.seq_length})  # plan both at one length
    return spec


def checkpoint_parent(
    source: Path, target: ModelSpec, from_model: ModelSpec | None, tag: str | None
) -> tuple[Any, ModelSpec, str]:
    """(parent HF model in fp32, its description, the checkpoint it came from) for the newest complete (or
    `tag`) checkpoint of a `dstk train --checkpoint-dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    state, tag = _checkpoint_state(source, tag)
    spec = from_model or infer_parent(target, state)
    model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatch
        raise UserError(
            f"--from-model: {spec.name} does not match the checkpoint: {str(exc).splitlines()[-1].strip()}"
        ) from None
    missing = {k for k in missing if not ("lm_head" in k and spec.tied_embeddings)}
    if missing or unexpected:
        raise UserError(
            f"--from-model: {spec.name} does not match the checkpoint: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    model.tie_weights()
    return model, spec, str(source / tag) if (source / tag).is_dir() else str(source)


# ---- the weight transforms ----------------------------------------------------------------------------------

# Axis = (unit kind or None, split): a producer axis copies its rows for the replicated units; a consumer axis
# (split=True) divides each original weight among the copies. Linear weights are (out, in); GPT-2's Conv1D (in, out).
_P, _S = False, True
_WIDTH_RULES: dict[str, list[tuple[str, tuple[tuple[str | None, bool], ...]]]] = {
    "gpt2": [
        (r"transformer\.w[tp]e\.weight$", ((None, _P), ("res", _P))),
        (r"\.ln_(1|2|f)\.(weight|bias)$", (("res", _P),)),
        (r"attn\.c_attn\.weight$", (("res", _S), ("qkv", _P))),
        (r"attn\.c_attn\.bias$", (("qkv", _P),)),
        (r"attn\.c_proj\.weight$", (("q", _S), ("res", _P))),
        (r"mlp\.c_fc\.weight$", (("res", _S), ("ffn", _P))),
        (r"mlp\.c_fc\.bias$", (("ffn", _P),)),
        (r"mlp\.c_proj\.weight$", (("ffn", _S), ("res", _P))),
        (r"c_proj\.bias$", (("res", _P),)),
        (r"lm_head\.weight$", ((None, _P), ("res", _S))),
    ],
    "llama": [
        (r"embed_tokens\.weight$", ((None, _P), ("res", _P))),
        (r"(layernorm|model\.norm)\.weight$", (("res", _P),)),
        (r"q_proj\.weight$", (("q", _P), ("res", _S))),
        (r"q_proj\.bias$", (("q", _P),)),
        (r"[kv]_proj\.weight$", (("kv", _P), ("res", _S))),
        (r"[kv]_proj\.bias$", (("kv", _P),)),
        (r"o_proj\.weight$", (("res", _P), ("q", _S))),
        (r"(gate|up)_proj\.weight$", (("ffn", _P), ("res", _S))),
        (r"(gate|up)_proj\.bias$", (("ffn", _P),)),
        (r"down_proj\.weight$", (("res", _P), ("ffn", _S))),
        (r"(o_proj|down_proj)\.bias$", (("res", _P),)),
        (r"lm_head\.weight$", ((None, _P), ("res", _S))),
    ],
}


def _unit_maps(g: Growth) -> dict[str, Any]:
    """New index → original index for each kind of unit (copies appended as whole blocks: j ← j mod n)."""
    import torch

    p, t = g.parent, g.target
    sizes = {
        "res": (p.hidden_size, t.hidden_size),
        "q": (p.n_heads * p.head_dim, t.n_heads * t.head_dim),
        "kv": (p.n_kv_heads * p.head_dim, t.n_kv_heads * t.head_dim),
        "ffn": (p.ffn_hidden_size, t.ffn_hidden_size),
    }
    maps = {k: torch.arange(new) % old for k, (old, new) in sizes.items()}
    q_old = sizes["q"][0]  # GPT-2's fused c_attn: [q | k | v], each n·d wide
    maps["qkv"] = torch.cat([maps["q"] + i * q_old for i in range(3)])
    return maps


def _expand(
    tensor: Any, axes: tuple[tuple[str | None, bool], ...], maps: dict[str, Any], noise: float, gen: Any
) -> Any:
    import torch

    out = tensor
    for dim, (kind, split) in enumerate(axes):
        if kind is None:
            continue
        index = maps[kind]
        old = tensor.shape[dim]
        out = out.index_select(dim, index)
        if split and len(index) > old:
            r = 1 + noise * (2 * torch.rand(out.shape, generator=gen, dtype=torch.float64) - 1)
            sums = torch.zeros(*out.shape[:dim], old, *out.shape[dim + 1 :], dtype=torch.float64)
            sums.index_add_(dim, index, r)
            out = (out.double() * r / sums.index_select(dim, index)).to(tensor.dtype)
    return out


def widen(state: dict[str, Any], g: Growth, noise: float, seed: int) -> dict[str, Any]:
    """The parent's weights replicated to the target's width (function-preserving, see the module docstring)."""
    import torch

    if all(v == 1 for v in g.factors.values()):
        return state
    rules = _WIDTH_RULES.get(g.parent.family.naming)
    if rules is None:  # plan_growth refuses to widen ALiBi models, the one naming without rules
        raise RuntimeError(f"width growth: no weight rules for {g.parent.architecture}")
    maps, gen = _unit_maps(g), torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        axes = next((axes for pattern, axes in rules if re.search(pattern, name)), None)
        if axes is None:
            raise RuntimeError(f"width growth: no rule for weight {name}")
        if name.startswith("lm_head") and g.parent.tied_embeddings:
            continue  # tied: the grown model re-ties it to the widened embedding
        out[name] = _expand(tensor, axes, maps, noise, gen)
        final_norm = re.search(r"(transformer\.ln_f|model\.norm)\.", name)
        if final_norm and g.parent.tied_embeddings:
            out[name] = out[name] / g.factors["res"]  # the tied head sums k copies of every residual unit
    return out


def deepen(state: dict[str, Any], g: Growth) -> dict[str, Any]:
    """Target blocks as copies of parent blocks (`g.blocks`); new blocks' output projections zeroed if asked."""
    prefix = g.parent.family.block_prefix
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.(.*)")
    per_block: dict[int, dict[str, Any]] = {}
    out = {}
    for name, tensor in state.items():
        m = pattern.match(name)
        if m:
            per_block.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        else:
            out[name] = tensor
    zero = g.parent.family.residual_outputs
    for j, (src, new) in enumerate(g.blocks):
        for rest, tensor in per_block[src].items():
            copy = tensor.clone()
            if new and g.new_blocks == "zero-out" and rest.startswith(zero):
                copy.zero_()
            out[f"{prefix}{j}.{rest}"] = copy
    return out


# ---- the whole operation ------------------------------------------------------------------------------------


@dataclass
class GrowResult:
    out: Path
    growth: Growth
    source: str
    n_params: tuple[int, int]
    check: dict[str, Any]

    def record(self) -> dict[str, Any]:
        g = self.growth
        return {
            "source": self.source,
            "parent": g.parent.model_dump(),
            "target": g.target.model_dump(),
            "depth_method": g.depth_method,
            "new_blocks": g.new_blocks,
            "blocks": [{"block": j, "from": src, "new": new} for j, (src, new) in enumerate(g.blocks)],
            "width_factors": g.factors,
            "function_preserving": g.function_preserving,
            "n_params": {"parent": self.n_params[0], "grown": self.n_params[1]},
            "check": self.check,
        }


def _check_batches(data: Path | None, rows: int, vocab: int, seq: int, seed: int) -> tuple[list[Any], str]:
    """Validation rows of `data` (fixed order), or seeded random tokens when no data is given."""
    import torch

    if data is None:
        ids = torch.randint(0, vocab, (4, min(seq, 128)), generator=torch.Generator().manual_seed(seed))
        return [(ids, ids)], "4 random sequences"
    from toolkit.data.loader import eval_batches, load_split

    split = data / "validation"
    if not split.is_dir():
        raise UserError(f"--data: {data} has no validation split (make it with dstk data prepare)")
    packed = load_split(split, seed)  # packed rows or --no-pack documents
    if packed.seq_length > seq:
        raise UserError(f"--data: sequences of {packed.seq_length} exceed the model's {seq} positions")
    batches = [(b.input_ids, b.labels) for b in eval_batches(packed, 8, 0, 1, rows)]
    return batches, f"{sum(len(b[0]) for b in batches)} validation rows of {data}"


def compare(parent: Any, grown: Any, batches: list[Any]) -> dict[str, float]:
    """Token-weighted mean loss of both models on the same batches in eval mode (no dropout), and the largest
    logit difference: the proof that a function-preserving growth preserved the function."""
    import torch

    totals, tokens, max_logit = [0.0, 0.0], 0, 0.0
    for model in (parent, grown):
        model.eval()
        model.loss_type = "ForCausalLM"  # as toolkit.run.models sets it: GPT-2's class name hides it from HF
    with torch.no_grad():
        for ids, labels in batches:
            a, b = parent(input_ids=ids, labels=labels), grown(input_ids=ids, labels=labels)
            n = int((labels[:, 1:] != -100).sum())
            totals[0] += float(a.loss.double()) * n
            totals[1] += float(b.loss.double()) * n
            tokens += n
            max_logit = max(max_logit, float((a.logits - b.logits).abs().max()))
    before, after = totals[0] / tokens, totals[1] / tokens
    return {
        "parent_loss": before,
        "grown_loss": after,
        "abs_diff": abs(after - before),
        "max_logit_diff": max_logit,
    }


def _copy_tokenizer(src: Path | None, out: Path) -> None:
    if src is None:
        return
    for f in Path(src).iterdir():
        tokenizer_file = f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges"))
        if f.is_file() and tokenizer_file:
            shutil.copy(f, out / f.name)


def grow(
    source: Path,
    target: ModelSpec,
    out: Path,
    *,
    from_model: ModelSpec | None = None,
    tag: str | None = None,
    depth_method: DepthMethod = "stack",
    new_blocks: NewBlocks = "zero-out",
    width_noise: float = 0.5,
    seed: int = 0,
    data: Path | None = None,
    eval_rows: int = 64,
    tokenizer: Path | None = None,
) -> GrowResult:
    """Grow the model at `source` into `target` and write it to `out` (save_pretrained + `dstk_grow.json`)."""
    if not 0 <= width_noise < 1:
        raise UserError(f"--width-noise: {width_noise} must be in [0, 1)")
    if eval_rows <= 0:
        raise UserError(f"--eval-rows: {eval_rows} must be positive")
    parent_spec = pretrained_spec(source, target, from_model)
    g = plan_growth(parent_spec, target, depth_method, new_blocks) if parent_spec else None
    # validated before torch is even imported (a save_pretrained parent describes itself in config.json)
    import torch
    from transformers import AutoModelForCausalLM

    if g is not None:
        parent_model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch.float32, attn_implementation=g.parent.family.attention_implementation
        )
        where = str(source)
    else:
        parent_model, parent_spec, where = checkpoint_parent(source, target, from_model, tag)
        g = plan_growth(parent_spec, target, depth_method, new_blocks)
    import sys

    # the parent loaded and the growth is valid: what follows (the weights, the check) takes seconds to minutes
    print(f"growing {where} into {target.name} …", file=sys.stderr, flush=True)
    state = {k: v.detach().float() for k, v in parent_model.state_dict().items()}
    state = deepen(widen(state, g, width_noise, seed), g)
    grown = AutoModelForCausalLM.from_config(hf_config(target), dtype=torch.float32)
    missing, unexpected = grown.load_state_dict(state, strict=False)
    missing = {k for k in missing if not ("lm_head" in k and target.tied_embeddings)}
    if missing or unexpected:
        raise RuntimeError(
            f"grown weights do not fit {target.name}: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )
    grown.tie_weights()
    seq = target.max_position_embeddings if target.position_embedding == "learned" else target.seq_length
    batches, what = _check_batches(data, eval_rows, target.vocab_size, seq, seed)
    check = {**compare(parent_model, grown, batches), "on": what}
    n_params = (sum(p.numel() for p in parent_model.parameters()), sum(p.numel() for p in grown.parameters()))
    out.mkdir(parents=True, exist_ok=True)
    grown.save_pretrained(out)
    _copy_tokenizer(tokenizer or (source if (source / "config.json").is_file() else None), out)
    result = GrowResult(out, g, where, n_params, check)
    (out / RECORD).write_text(json.dumps(result.record(), indent=2, sort_keys=True) + "\n")
    return result
