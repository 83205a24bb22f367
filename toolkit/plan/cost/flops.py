"""FLOPs per token: the model FLOPs that define MFU, and the hardware FLOPs a layout really executes.

Model FLOPs follow PaLM (Chowdhery et al. 2022, App. B): 6N + 12·L·H·Q·T per token, L layers, H heads, Q head
dim, T sequence length (keys attended: a sliding-window layer's window where shorter), and N the parameters a token multiplies by — the active parameters (for MoE the
routed top-k experts) less the lookup-only tables, an untied input embedding and learned positions, which cost
no FLOPs (nanoGPT's `estimate_mfu` leaves the position table out likewise; a tied embedding stays, being the
LM head's matmul). MFU divides model FLOPs by the accelerator's peak in the training precision; it ignores
recomputation by definition. Hardware FLOPs are model FLOPs plus what a layout computes again or in vain, so
never fewer: the blocks' forward again with full recomputation (the ×4/3 of Narayanan et al. 2021, eq. 3, LM head
excepted; less each block's down projection where the checkpoint stops early, Layout.recompute_stops_early), the
attention core with selective recomputation (Korthikanti et al. 2022, §5), and the capacity padding of MoE
experts. The same model FLOPs price a training run (`dstk plan --tokens`) and read `--mfu`.
"""

from __future__ import annotations

from toolkit.plan.cost.activations import op_sac_matmuls
from toolkit.plan.cost.attention import attention_cores
from toolkit.plan.cost.moe import routed_copies
from toolkit.plan.params import count_params
from toolkit.plan.specs import ModelSpec


def attended_keys(model: ModelSpec) -> int:
    """Keys per query summed over the layers: T in a global layer, min(W, T) in a local (sliding-window) one
    — the T of PaLM's 12·L·H·Q·T, layer by layer (Gemma 3's 5:1 local:global layers at W = 1024 attend to
    about a quarter of what global layers would at 32k; Gemma Team 2025, §2.2)."""
    s, local = model.seq_length, model.n_local_layers
    return (model.n_layers - local) * s + local * min(model.sliding_window or s, s)


def attention_flops_per_token(model: ModelSpec) -> float:
    """Forward + backward FLOPs of QKᵀ and AV per token over all layers: 12·H·Q·ΣT (PaLM App. B; ΣT over the
    layers, a local layer's T its window), 6·H·(Q_qk + Q_v)·ΣT where q/k and v heads differ in width. The
    step-time model still prices the whole square for local layers: HF's SDPA path hands the window to the
    kernel as a mask, and a masked score costs what any does. A traced model sums the cores its trace saw."""
    if model.trace is not None:
        s = model.seq_length
        total = 0.0
        for moe in (False, True):
            blocks = model.trace.kind(moe).blocks
            for c in attention_cores(model, moe):
                keys = min(c.window or s, s)
                total += blocks * c.count * 6 * c.heads * (c.qk + c.v) * keys
        return total
    return 6 * model.n_heads * (model.head_dim + model.v_width) * attended_keys(model)


def matmul_params(model: ModelSpec) -> int:
    """The N of 6N: active parameters less lookup-only tables (learned positions, an untied input embedding)."""
    pc = count_params(model)
    return pc.active - pc.position_embedding - (pc.word_embedding if pc.lm_head else 0)


def model_flops_per_token(model: ModelSpec, frozen: bool = False) -> float:
    """Training FLOPs per token in the MFU convention: 6·N + 12·L·H·Q·T. With the weights `frozen` (LoRA)
    backward computes no weight gradients: 4·N (the adapters' r-sized work is left out)."""
    return (4 if frozen else 6) * matmul_params(model) + attention_flops_per_token(model)


def model_tflops_per_gpu(
    model: ModelSpec, tokens_per_s: float, world_size: int, frozen: bool = False
) -> float:
    """Model TFLOP/s per accelerator at `tokens_per_s` over `world_size` ranks (PaLM convention, no
    recomputation): the one formula behind a prediction's and a run's measured TFLOP/s and MFU, so the two
    compare like with like (a LoRA run's frozen base counts 4·N, not 6·N, on both sides)."""
    return model_flops_per_token(model, frozen) * tokens_per_s / world_size / 1e12


def hardware_flops_per_token(
    model: ModelSpec,
    recompute: str,
    frozen: bool = False,
    recompute_every: int = 1,
    early_stop: bool = False,
    float8: str | None = None,
    dense_experts: bool = False,
) -> float:
    """FLOPs the accelerators execute per token: model FLOPs, plus expert capacity padding and recomputation.

    Experts compute on capacity-padded buffers (capacity factor × routed tokens; a factor below 1 drops
    tokens, which the model FLOPs still count). Full recomputation repeats the blocks' forward, padding included
    (of n_layers // recompute_every blocks when only every K-th is checkpointed), not the LM head's (runtimes
    checkpoint block by block; Narayanan et al. 2021, eq. 3, counts the logit layer 3 times: 96·B·s·l·h²·(1 +
    s/6h + V/16lh)); `early_stop` (a checkpoint that stops before each dense block's last linear layer,
    toolkit.plan.cost.compute.early_stop_skips) leaves that layer's 2·ffn·h per token out of it; selective
    recomputation repeats the attention core; torchtitan's op-level policy (`ops`) the matmuls it does not save.
    Llama 4's HF block without expert parallelism (`dense_experts`) computes every expert, all of it executed.
    """
    pc = count_params(model)
    padding = pc.n_moe_layers * pc.expert * max(0.0, routed_copies(model, dense_experts) - pc.moe_top_k)
    attention_forward = attention_flops_per_token(model) / 3
    total = model_flops_per_token(model, frozen) + (4 if frozen else 6) * padding
    if recompute == "full":
        share = (model.n_layers // recompute_every) / model.n_layers if recompute_every > 1 else 1.0
        head = pc.lm_head or pc.word_embedding  # the LM head's matrix (a tied one is the embedding's)
        skipped = pc.n_dense_layers if early_stop else 0
        tail = skipped * model.ffn_hidden_size * model.hidden_size  # each dense block's down projection
        total += share * (2 * (matmul_params(model) - head + padding - tail) + attention_forward)
    elif recompute == "selective":
        total += attention_forward
    elif recompute == "ops":
        _, replayed = op_sac_matmuls(model, float8=float8)
        total += 2 * pc.n_dense_layers * sum(k * n for k, n in replayed)
    return total
