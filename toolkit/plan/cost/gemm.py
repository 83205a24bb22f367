"""GEMMs on the roofline: compute-bound at the sustained matmul rate, less tile and wave quantization, or
memory-bound on their operands (Williams et al. 2009).

A GEMM runs at `gpu_matmul_efficiency` of peak unless its arithmetic intensity puts it under the memory
roofline: time = max(FLOPs / (peak · eff), bytes / HBM bandwidth). Where the cluster gives its SM count, each
GEMM's efficiency also carries its tile and wave quantization (`quantization_efficiency`).
"""

from __future__ import annotations

import functools
import math

from toolkit.plan.cost.fp8 import Fp8Gemms, Linear
from toolkit.plan.specs import ClusterSpec

# Output tiles cuBLAS runs large bf16/fp16 GEMMs with on Ampere/Hopper: the guide lists 256×128 and 128×256 as
# the most efficient, then 128×128 (NVIDIA, "Matrix Multiplication Background User's Guide" §2.3).
GEMM_TILES = ((256, 128), (128, 256), (128, 128))


@functools.lru_cache(maxsize=65536)  # the planner asks for the same shapes thousands of times
def quantization_efficiency(m: float, n: float, sm_count: int, groups: float = 1.0) -> float:
    """Fraction of the GPU's tile slots an m×n GEMM output keeps busy, for the best of `GEMM_TILES`.

    Tile quantization: the last row/column of tiles is partly empty (m·n over the tiled area). Wave
    quantization: the tiles run in waves of `sm_count`, and the last wave is partly idle (tiles over
    waves·SMs). NVIDIA's guide §3.1-3.2 measures both on A100 (e.g. throughput peaks at N = 1536, 3072, ...
    for M = 2304: 108, 216, ... tiles of 256×128). Large training GEMMs sit near 1; a TP shard of a 1-2k
    hidden size or a short micro-batch loses 10-40 %.
    """
    if m <= 0 or n <= 0:
        return 1.0
    best = 0.0
    g = max(1, round(groups))
    for bm, bn in GEMM_TILES:
        tm, tn = math.ceil(m / bm), math.ceil(n / bn)
        tiles = g * tm * tn  # a grouped GEMM's tiles of all groups share the waves
        waves = math.ceil(tiles / sm_count)
        best = max(best, (m * n) / (tm * bm * tn * bn) * tiles / (waves * sm_count))
    return best


def gemm_s(
    m: float,
    k: float,
    n: float,
    e: float,
    peak: float,
    cluster: ClusterSpec,
    efficiency: float | None = None,
    out_e: int | None = None,
    groups: float = 1.0,
    in_flight: float | None = None,
) -> float:
    """One GEMM (m×k)·(k×n), or `groups` of them (a rank's experts, each m×k·k×n): compute-bound at
    `efficiency` (default the cluster's matmul efficiency) of `peak` (less the tile quantization of each group
    and, where the SM count is known, the wave quantization of the tiles of the `in_flight` groups that run at
    once — default all, one grouped kernel) or memory-bound on its operands (`e` bytes each) and result
    (`out_e`, default `e`)."""
    eff = efficiency or cluster.gpu_matmul_efficiency
    if cluster.gpu_sm_count:
        sharing = min(groups, in_flight) if in_flight else groups
        eff *= quantization_efficiency(m, n, cluster.gpu_sm_count, sharing)
    out = e if out_e is None else out_e
    return groups * max(
        2 * m * k * n / (peak * eff),
        (e * (m * k + k * n) + out * m * n) / (cluster.gpu_memory_gb_per_s * 1e9),
    )


def linear_s(x: Linear, e: int, peak: float, cluster: ClusterSpec, fp8: Fp8Gemms | None) -> float:
    """A linear layer's forward GEMM: in the training precision, or with FP8 (MXFP8, NVFP4) operands and a
    bf16 result."""
    m, grouped = x.m / x.groups, dict(groups=x.groups, in_flight=x.in_flight)
    if fp8 is None:
        return gemm_s(m, x.k, x.n, e, peak, cluster, **grouped)
    return gemm_s(m, x.k, x.n, fp8.operand_bytes, fp8.peak, cluster, fp8.efficiency, out_e=e, **grouped)
