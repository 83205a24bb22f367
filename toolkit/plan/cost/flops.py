"""FLOPs per token: the model FLOPs that define MFU, and the hardware FLOPs a layout really executes.

Model FLOPs follow PaLM (Chowdhery et al. 2022, App. B): 6N + 12·L·H·Q·T per token, N the parameters a token
uses (active parameters for MoE), L layers, H heads, Q head dim, T sequence length. MFU divides these by peak;
they ignore recomputation by definition. Hardware FLOPs add what a layout really computes again: a whole
extra forward with full recomputation (the ×4/3 of Narayanan et al. 2021, eq. 3), the attention core with
selective recomputation (Korthikanti et al. 2022, §5), and the capacity padding of MoE experts.
"""

from __future__ import annotations

from toolkit.plan.params import count_params
from toolkit.plan.specs import ModelSpec


def attention_flops_per_token(model: ModelSpec) -> float:
    """Forward + backward FLOPs of QKᵀ and AV per token over all layers: 12·L·H·Q·T (PaLM App. B)."""
    return 12 * model.n_layers * model.n_heads * model.head_dim * model.seq_length


def model_flops_per_token(model: ModelSpec, frozen: bool = False) -> float:
    """Training FLOPs per token in the MFU convention: 6·N_active + 12·L·H·Q·T. With the weights `frozen`
    (LoRA) backward computes no weight gradients: 4·N (the adapters' r-sized work is left out)."""
    return (4 if frozen else 6) * count_params(model).active + attention_flops_per_token(model)


def model_tflops_per_gpu(
    model: ModelSpec, tokens_per_s: float, world_size: int, frozen: bool = False
) -> float:
    """Model TFLOP/s per accelerator at `tokens_per_s` over `world_size` ranks (PaLM convention, no
    recomputation): the one formula behind a prediction's and a run's measured TFLOP/s and MFU, so the two
    compare like with like (a LoRA run's frozen base counts 4·N, not 6·N, on both sides)."""
    return model_flops_per_token(model, frozen) * tokens_per_s / world_size / 1e12


def hardware_flops_per_token(model: ModelSpec, recompute: str, frozen: bool = False) -> float:
    """FLOPs the accelerators execute per token, recomputation and expert capacity padding included.

    Matmul parameters exclude lookup-only tables (the input embedding when untied, learned positions),
    which cost no FLOPs; experts compute on capacity-padded buffers (capacity factor × routed tokens).
    """
    pc = count_params(model)
    lookup = pc.position_embedding + (pc.word_embedding if pc.lm_head else 0)
    routed_experts = pc.n_moe_layers * pc.moe_top_k * pc.expert
    matmul = pc.active - lookup - routed_experts + routed_experts * model.moe_capacity_factor
    forward = 2 * matmul + attention_flops_per_token(model) / 3
    total = 3 * forward - (2 * matmul if frozen else 0)
    if recompute == "full":
        total += forward
    elif recompute == "selective":
        total += attention_flops_per_token(model) / 3
    return total
