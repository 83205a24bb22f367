"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): what they add and
what they freeze, for the cost model and for `dstk train --lora`.

A LoRA adapter on a linear map W (in → out) adds B·A with A: in → r and B: r → out, r·(in + out) trainable
parameters; W and everything else stays frozen. The engine then keeps gradients and optimizer states for the
adapters only; the frozen base weights are held in the training precision (and partitioned at ZeRO-3) like
any parameter. Backward computes input gradients through every frozen matrix but no weight gradients for
them, so it costs about one forward instead of two.

The default target modules are peft's (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`): GPT-2's fused
`c_attn`, BLOOM's `query_key_value`, the query and value projections of Llama-family models. Names match
module-name suffixes as peft matches them (GPT-2's `c_proj` is both the attention output and the MLP output).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.errors import UserError
from toolkit.plan.specs import ModelSpec


@dataclass(frozen=True)
class LoraSpec:
    r: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None
    """Module-name suffixes to adapt (default: peft's for the architecture)."""

    def text(self) -> str:
        """The `--lora` spelling of this spec (what the layout and the config carry)."""
        out = f"r={self.r},alpha={self.alpha:g}"
        if self.dropout:
            out += f",dropout={self.dropout:g}"
        if self.targets:
            out += f",targets={'+'.join(self.targets)}"
        return out


def parse_lora(text: str) -> LoraSpec:
    """`r=16,alpha=32[,dropout=0.05][,targets=q_proj+v_proj]` → LoraSpec, or a one-line UserError."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in ("r", "alpha", "dropout", "targets") or not value.strip():
            raise UserError(
                f"--lora: {part.strip()!r} is not one of r=N, alpha=X, dropout=P, targets=a+b "
                "(e.g. --lora r=16,alpha=32)"
            )
        fields[key] = value.strip()
    if "r" not in fields:
        raise UserError("--lora: the rank r is required (e.g. --lora r=16,alpha=32)")
    try:
        r = int(fields["r"])
        alpha = float(fields.get("alpha", 2 * r))
        dropout = float(fields.get("dropout", 0.0))
    except ValueError as err:
        raise UserError(f"--lora: {err}; r is an integer, alpha and dropout are numbers") from None
    if r <= 0:
        raise UserError(f"--lora: r={r} must be a positive integer")
    if alpha <= 0:
        raise UserError(f"--lora: alpha={alpha:g} must be positive")
    if not 0 <= dropout < 1:
        raise UserError(f"--lora: dropout={dropout:g} must be in [0, 1)")
    targets = tuple(t for t in fields["targets"].split("+") if t) if "targets" in fields else None
    return LoraSpec(r=r, alpha=alpha, dropout=dropout, targets=targets)


def block_linears(model: ModelSpec) -> dict[str, list[tuple[int, int]]]:
    """(in, out) of every linear map in one block, by the HF module name peft matches."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    q, kv = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    naming = model.family.naming
    if naming == "gpt2":
        return {"c_attn": [(h, q + 2 * kv)], "c_proj": [(q, h), (ffn, h)], "c_fc": [(h, ffn)]}
    if naming == "bloom":
        return {
            "query_key_value": [(h, q + 2 * kv)],
            "dense": [(q, h)],
            "dense_h_to_4h": [(h, ffn)],
            "dense_4h_to_h": [(ffn, h)],
        }
    out = {"q_proj": [(h, q)], "k_proj": [(h, kv)], "v_proj": [(h, kv)], "o_proj": [(q, h)]}
    if not model.is_moe:
        out.update(gate_proj=[(h, ffn)], up_proj=[(h, ffn)], down_proj=[(ffn, h)])
    return out


def targets(model: ModelSpec, spec: LoraSpec) -> tuple[str, ...]:
    names = spec.targets or model.family.lora_targets
    known = block_linears(model)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(
            f"--lora: targets {'+'.join(unknown)} are not linear modules of a {model.family_label} block; "
            f"valid: {', '.join(known)}"
        )
    return tuple(names)


def adapter_params_per_block(model: ModelSpec, spec: LoraSpec) -> int:
    """Trainable parameters LoRA adds to one block: r·(in + out) per adapted linear map."""
    shapes = block_linears(model)
    return sum(spec.r * (i + o) for name in targets(model, spec) for i, o in shapes[name])


def adapter_params(model: ModelSpec, spec: LoraSpec) -> int:
    """Trainable parameters of the whole model under `spec` (adapters in every block)."""
    return model.n_layers * adapter_params_per_block(model, spec)
