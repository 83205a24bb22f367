"""One unit convention for every figure dstk prints (pure).

Memory is in binary units: GiB = 2³⁰ bytes, the unit of the cluster files (`gpu_memory_gib`,
`cpu_memory_gib`) and of what CUDA and the allocators report; below one GiB the same figure drops to MiB or
KiB, so a small model's states do not print as 0.0. Bandwidth is in GB/s = 10⁹ bytes/s, the unit of the
cluster files (`*_gb_per_s`) and of NVLink/NIC datasheets and nccl-tests. Compute is in TFLOP/s. JSON carries
memory as integer bytes (`as_bytes`), never a fraction of a byte.
"""

from __future__ import annotations

GIB = 2**30
MIB = 2**20
KIB = 2**10

UNITS_NOTE = "memory in GiB = 2³⁰ bytes (MiB = 2²⁰ below 1 GiB), bandwidth in GB/s = 10⁹ bytes/s"
"""The convention, stated once at the top of a human-readable estimate or plan."""


def format_bytes(n: float, digits: int = 2) -> str:
    """`n` bytes in GiB, or MiB/KiB/B when under one GiB (`digits` after the point)."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= scale:
            return f"{n / scale:,.{digits}f} {unit}"
    return f"{n:,.0f} B"


def format_count(n: float) -> str:
    """A count to three significant figures with K/M/B/T: 6.74B, 124M, 3.72M, 1.01T (never 0.00B)."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= 0.9995 * scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def format_tflops(flops_per_s: float) -> str:
    """FLOP/s in TFLOP/s to four significant figures (a CPU's 0.2031 too, not a switch to GFLOP/s)."""
    return f"{flops_per_s / 1e12:,.4g} TFLOP/s"


def as_bytes(n: float) -> int:
    """A byte figure for JSON: the nearest whole byte."""
    return round(n)
