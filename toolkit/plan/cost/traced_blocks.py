"""The cost model's terms for a traced block (toolkit/plan/traced.py): what the trace saw, in place of a table
family's formulas.

Its GEMMs against weights (the routed ones over E / ep experts' weights, top-k rows per token, padded by the
capacity factor), its memory-bound traffic and op count, and its saved activations — all recorded in bf16 at
one rank (tensor, sequence and pipeline parallelism are refused for traced models), scaled to the layout's
element size.
"""

from __future__ import annotations

from toolkit.plan.cost.fp8 import Linear
from toolkit.plan.specs import ClusterSpec, ModelSpec


def traced_linears(model: ModelSpec, m: float, moe: bool, ep: int = 1) -> list[Linear]:
    """A traced block's GEMMs against weights for `m` tokens: a routed one takes m · top-k · capacity rows
    over E / ep experts' weights, a layer the kind's blocks run `count` times on average takes count × m rows
    (tensor parallelism is refused for traced models)."""
    assert model.trace is not None
    out = []
    for x in model.trace.kind(moe).linears:
        routed = x.experts > 1
        rows = m * x.tokens * x.count * (model.moe_capacity_factor if routed else 1.0)
        weights = (x.experts / ep if routed else 1) * x.k * x.n * x.count
        out.append(Linear(rows, x.k, x.n, weights, x.bias))
    return out


def traced_block_time(
    model: ModelSpec, cluster: ClusterSpec, m: float, e: int, moe: bool, gemms_s: float, frozen: bool
) -> tuple[float, float]:
    """(forward, backward) seconds of a traced block for `m` tokens: its GEMMs and attention (`gemms_s`), its
    other products between activations at the matmul rate, its memory-bound ops' traffic as traced (in bf16,
    scaled to `e` bytes), and its ops' issue cost; backward two forwards (one `frozen`), as for any block."""
    assert model.trace is not None
    kind = model.trace.kind(moe)
    peak = cluster.peak_flops("fp32" if e == 4 else "bf16")
    work = gemms_s + kind.other_flops_per_token * m / (peak * cluster.gpu_matmul_efficiency)
    work += kind.elementwise_bytes_per_token * (e / 2) * m / (cluster.gpu_memory_gb_per_s * 1e9)
    issue = kind.kernels * cluster.kernel_launch_us * 1e-6
    times = 1 if frozen else 2
    one = (
        work + issue if cluster.accelerator == "cpu" else max(work, issue)
    )  # CPU: one thread issues and computes
    return one, times * one


def traced_block_bytes(model: ModelSpec, tokens: int, act_bytes: int, recompute: str, moe: bool) -> float:
    """What a traced block keeps for `tokens` tokens without recomputation: the bytes its trace counted per
    token (in bf16, scaled to `act_bytes`), plus its materialized scores per token and key unless selective
    recomputation (or a fused kernel, whose stand-in stores none) leaves them out."""
    assert model.trace is not None
    kind = model.trace.kind(moe)
    per_token = kind.saved_bytes_per_token
    if recompute == "none":
        per_token += kind.saved_bytes_per_token_per_key * model.seq_length
    return per_token * act_bytes / 2 * tokens
