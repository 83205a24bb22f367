"""Mixture-of-Experts for HF models in the DeepSpeed engine.

Dense GPT-2 and Llama-family models become MoE models by replacing the MLP of every `moe_layer_interval`-th
block with DeepSpeed's own MoE layer (`deepspeed.moe.layer.MoE`: top-k gate, capacity factor, noisy gating,
experts sharded over `ep_size` ranks by all-to-all). Each expert starts as a copy of the block's trained (or
initialised) MLP — DeepSpeed deep-copies the module it is given — so a converted model computes what the
dense one did until the experts diverge. The router's load-balancing loss (Lepikhin et al. 2021, GShard
eq. 4; Fedus et al. 2022, Switch §2.2) is collected per forward and added to the language-model loss with
a coefficient. DeepSpeed's engine refuses its native MoE at ZeRO-3 ("Use AutoEP or choose ZeRO stage 1/2"),
which dstk's rule `native_moe_needs_zero_le_2` enforces before launch.

HF's own MoE models (Mixtral) keep their sparse block: transformers computes the router loss itself when
`output_router_logits` is on, and at ZeRO-3 DeepSpeed treats `MixtralSparseMoeBlock` as a leaf module by
default (zero_optimization.leaf_module), gathering its fused experts at once instead of hooking each one.
"""

from __future__ import annotations

from typing import Any

from toolkit.plan.specs import DEFAULT_AUX_LOSS_COEF, ModelSpec


class AuxLoss:
    """The router losses of the MoE layers since the last `pop`, summed (one value per forward)."""

    def __init__(self, coefficient: float) -> None:
        self.coefficient = coefficient
        self.losses: list[Any] = []

    def pop(self) -> Any:
        total = sum(self.losses) if self.losses else 0.0
        self.losses = []
        return self.coefficient * total


def _blocks(model: Any) -> Any:
    base = model.base_model
    blocks = getattr(base, "h", None) or getattr(base, "layers", None)
    if blocks is None:
        raise TypeError(f"{type(model).__name__}: no decoder blocks found (expected .h or .layers)")
    return blocks


def convert_to_moe(
    model: Any,
    spec: ModelSpec,
    ep_size: int,
    noisy_gate_policy: str | None = "RSample",
    aux_coef: float = DEFAULT_AUX_LOSS_COEF,
) -> AuxLoss:
    """Replace the MLP of every `moe_layer_interval`-th block (counting from 1) by a DeepSpeed MoE layer.

    Needs the process group up: DeepSpeed creates the expert-parallel groups as the layers are built.
    """
    import torch
    from deepspeed.moe.layer import MoE

    aux = AuxLoss(aux_coef)

    class Expert(torch.nn.Module):
        """The block's MLP as one expert. DeepSpeed hands each expert a slice of its dispatch buffer that is not
        contiguous, and GPT-2's Conv1D `view`s its input, so the slice is made contiguous first."""

        def __init__(self, mlp: torch.nn.Module) -> None:
            super().__init__()
            self.mlp = mlp

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mlp(x.contiguous())

    class MoEMLP(torch.nn.Module):
        """Calls DeepSpeed's MoE where the block called its MLP; returns hidden states, records l_aux."""

        def __init__(self, mlp: torch.nn.Module) -> None:
            super().__init__()
            self.moe = MoE(
                hidden_size=spec.hidden_size,
                expert=Expert(mlp),
                num_experts=spec.num_experts,
                ep_size=ep_size,
                k=spec.moe_top_k,
                capacity_factor=spec.moe_capacity_factor,
                eval_capacity_factor=spec.moe_capacity_factor,
                min_capacity=4,
                noisy_gate_policy=noisy_gate_policy,
                drop_tokens=True,
            )

        def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            out, l_aux, _ = self.moe(hidden_states)
            aux.losses.append(l_aux)
            return out

    for j, block in enumerate(_blocks(model)):
        if (j + 1) % spec.moe_layer_interval == 0:
            block.mlp = MoEMLP(block.mlp)
    return aux


def optimizer_groups(model: Any) -> list[dict[str, Any]]:
    """Parameter groups with experts apart, as DeepSpeed's ZeRO-1/2 need them (one group per expert group)."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    return split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "params"}
    )


def count_rank_params(model: Any) -> dict[str, int]:
    """Parameters this rank holds: experts (DeepSpeed marks them `allreduce = False`) and the rest."""
    from deepspeed.moe.utils import is_moe_param

    out = {"expert": 0, "dense": 0}
    for p in model.parameters():
        n = getattr(p, "ds_numel", None) or p.numel()
        out["expert" if is_moe_param(p) else "dense"] += n
    return out
