"""`--cluster local`: a cluster description detected from the machine dstk runs on.

A frozen preset describes one host; a user's host may be another GPU model, another GPU count, or a CPU
without native bf16 (where torch's bf16 matmul is ~75× slower than fp32: 0.8 vs 60 GFLOP/s per core on an
AVX2-only AMD EPYC, measured 2026-12-03). Detection reads what the machine says about itself, without
importing torch (the planning half must start in milliseconds):

- GPUs: `nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv` (the default
  table output parses too, for recorded fixtures), or on AMD Instinct `amd-smi static` / `rocm-smi` (and
  `rocminfo`; toolkit.host.amd_smi), each model looked up in `presets/gpus.yaml` — published dense peaks, HBM bandwidth,
  NVLink/xGMI/PCIe, bf16 support, each with its source;
- CPUs: `/proc/cpuinfo` (model, flags: `avx512_bf16`, `amx_bf16`, `avx512f`, `avx2`, `fma`; clock),
  NUMA nodes from sysfs, host memory from `/proc/meminfo`, free disk at the checkpoint path;
- a host fingerprint (CPU model and flags, cores, GPU model and driver, torch/DeepSpeed versions from package
  metadata) keying the cache that `dstk calibrate` writes: a matching calibration replaces the table values.

Every field says where it came from (`Detection.sources`); what could not be known is listed in
`Detection.unknown` with the value assumed, never guessed silently.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30

NVIDIA_SMI_QUERY = ("name", "memory.total", "driver_version", "compute_cap")

# bf16 emulation cost on a CPU without avx512_bf16/amx_bf16: torch 2.13's bf16 matmul falls back to a
# reference kernel. 1024² on one core of an AVX2-only AMD EPYC: 0.8 GFLOP/s against 60 GFLOP/s fp32
# (ratio 75), measured 2026-12-03 and re-measured by `dstk calibrate` on the host itself.
EMULATED_BF16_SLOWDOWN = 75.0


@dataclass(frozen=True)
class CpuInfo:
    """What `/proc/cpuinfo` says: model, ISA flags (of the first processor), logical CPUs, clock."""

    model: str
    vendor: str
    flags: frozenset[str]
    logical_cpus: int
    mhz: float | None

    @property
    def bf16_native(self) -> bool:
        """AVX512-BF16 or AMX-BF16: bf16 GEMMs run natively in oneDNN; otherwise torch emulates them."""
        return bool({"avx512_bf16", "amx_bf16"} & self.flags)

    def fp32_flops_per_cycle(self) -> int:
        """FP32 FLOPs per core per cycle from the vector ISA: two FMA pipes × lanes × 2 (multiply-add).

        AVX-512 on Intel Xeon (Skylake-SP and later, two 512-bit FMA units): 64; AVX2+FMA (Haswell and later,
        AMD Zen 1-4, whose AVX-512 is double-pumped 256-bit): 32; SSE only: 8. Intel 64 and IA-32
        Architectures Optimization Reference Manual, ch. 2; AMD Software Optimization Guide for Zen 3, §2.11.
        """
        if "avx512f" in self.flags and self.vendor == "GenuineIntel":
            return 64
        if "avx2" in self.flags and "fma" in self.flags:
            return 32
        return 8

    def bf16_flops_per_cycle(self) -> float:
        """bf16 FLOPs per core per cycle: AMX's tile multiply does 1,024 (Intel, Sapphire Rapids
        architecture day 2021: "1024 BF16 ops/cycle/core"); AVX512-BF16's VDPBF16PS twice the FP32 FMA rate;
        without either, the emulated rate measured on an AVX2 host (`EMULATED_BF16_SLOWDOWN`)."""
        if "amx_bf16" in self.flags:
            return 1024.0
        if "avx512_bf16" in self.flags:
            return 2.0 * self.fp32_flops_per_cycle()
        return self.fp32_flops_per_cycle() / EMULATED_BF16_SLOWDOWN


# oneDNN's ISA levels in the order `ONEDNN_MAX_CPU_ISA` caps them (oneDNN developer guide, "CPU dispatcher
# control", enum dnnl_cpu_isa_t; the AVX512_CORE_FP16/AMX names are aliases of the AVX10_1 ones). torch's CPU
# bf16 matmul runs through oneDNN, so a cap below AVX512_CORE_BF16 makes a native-bf16 host emulate bf16: on a
# Zen 4 EPYC (avx512_bf16) one core's 1024² bf16 product fell from 202 to 0.9 GFLOP/s with
# ONEDNN_MAX_CPU_ISA=AVX2, fp32 (MKL) unchanged at 82–99 — the rate of a real AVX2-only host (0.8). Measured
# 2026-12-04 with benchmarks/matmul_probe.py; torch's own ATEN_CPU_CAPABILITY=avx2 leaves bf16 at 209 (it does
# not reach oneDNN).
ONEDNN_ISA_LEVELS = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
)
ONEDNN_ISA_ALIASES = {
    "AVX512_CORE_FP16": "AVX10_1_512",
    "AVX512_CORE_AMX": "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16": "AVX10_1_512_AMX_FP16",
}


def onednn_isa_cap(cpu: CpuInfo, environ: Mapping[str, str]) -> tuple[CpuInfo, str | None]:
    """`cpu` as torch's bf16 kernels see it under `ONEDNN_MAX_CPU_ISA`: the bf16 flags a cap below their
    level hides are dropped (AMX below AVX10_1_512_AMX, AVX512-BF16 below AVX512_CORE_BF16), and a line
    saying so. fp32 flags stay: torch's fp32 matmul goes through MKL, which the cap does not reach. An
    unset, `DEFAULT` or unknown value changes nothing (an unknown one is named in the line)."""
    raw = environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA")
    if not raw or raw.upper() in ("DEFAULT", "ALL"):
        return cpu, None
    level = ONEDNN_ISA_ALIASES.get(raw.upper(), raw.upper())
    if level not in ONEDNN_ISA_LEVELS:
        return cpu, f"ONEDNN_MAX_CPU_ISA={raw} is not a oneDNN ISA level this version knows: ignored"
    rank = ONEDNN_ISA_LEVELS.index(level)
    hidden = set()
    if rank < ONEDNN_ISA_LEVELS.index("AVX10_1_512_AMX"):
        hidden |= {f for f in cpu.flags if f.startswith("amx")}
    if rank < ONEDNN_ISA_LEVELS.index("AVX512_CORE_BF16"):
        hidden.add("avx512_bf16")
    hidden &= cpu.flags
    if not hidden:
        return cpu, None
    capped = CpuInfo(cpu.model, cpu.vendor, cpu.flags - hidden, cpu.logical_cpus, cpu.mhz)
    return capped, f"ONEDNN_MAX_CPU_ISA={raw} hides {', '.join(sorted(hidden))} from oneDNN's bf16 kernels"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi (or amd-smi, rocm-smi, rocminfo) reports it."""

    name: str
    memory_mib: float | None
    driver: str | None = None
    compute_cap: str | None = None
    """CUDA compute capability, or the AMD gfx target (gfx942)."""
    tool: str = "nvidia-smi"
    """What reported it."""


# ---------------------------------------------------------------------------------------------- parsing


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor's model, vendor, flags and clock, and the number of processors listed."""
    first: dict[str, str] = {}
    count = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor":
            count += 1
        if count <= 1:
            first.setdefault(key, value.strip())
    mhz = first.get("cpu MHz")
    return CpuInfo(
        model=first.get("model name") or first.get("cpu model") or "unknown CPU",
        vendor=first.get("vendor_id", "unknown"),
        flags=frozenset((first.get("flags") or first.get("Features") or "").split()),
        logical_cpus=max(count, 1),
        mhz=float(mhz) if mhz and re.fullmatch(r"[0-9.]+", mhz) else None,
    )


def _mib(text: str) -> float | None:
    """'81920 MiB' / '81920' / '[N/A]' → MiB."""
    m = re.search(r"([0-9.]+)\s*(MiB|GiB)?", text)
    if not m:
        return None
    return float(m.group(1)) * (1024 if m.group(2) == "GiB" else 1)


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """GPUs from nvidia-smi output: the CSV of `--query-gpu=... --format=csv` (with its header, or without
    in `NVIDIA_SMI_QUERY` order), or the default table that people paste into issues."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if any("NVIDIA-SMI" in ln for ln in lines[:5]) or any(ln.startswith("|") for ln in lines):
        return _parse_smi_table(text)
    if not lines:
        return []
    header = [h.strip().split(" [")[0] for h in lines[0].split(",")]
    if "name" in header:
        rows = lines[1:]
    else:
        header, rows = list(NVIDIA_SMI_QUERY), lines
    gpus = []
    for row in rows:
        cells = dict(zip(header, (c.strip() for c in row.split(",")), strict=False))
        if not cells.get("name"):
            continue
        gpus.append(
            GpuInfo(
                name=cells["name"],
                memory_mib=_mib(cells.get("memory.total", "")),
                driver=cells.get("driver_version") or None,
                compute_cap=cells.get("compute_cap") or None,
            )
        )
    return gpus


_TABLE_NAME = re.compile(r"^\|\s*(\d+)\s+(.+?)\s+(On|Off)\s*\|")
_TABLE_MEMORY = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
# the header's driver: "Driver Version: 580.95.05", or from driver R610 on "KMD Version: 610.43.02" (with
# "CUDA UMD Version: 13.3"; sgl-project/sglang issue #27487, tests/data/hardware)
_TABLE_DRIVER = re.compile(r"(?:Driver|KMD) Version:\s*([0-9.]+)")


def _parse_smi_table(text: str) -> list[GpuInfo]:
    """The default `nvidia-smi` box: a name row per GPU, its memory use on the row below."""
    driver = _TABLE_DRIVER.search(text)
    gpus: list[GpuInfo] = []
    pending: str | None = None
    for line in text.splitlines():
        m = _TABLE_NAME.match(line)
        if m:
            pending = m.group(2).strip()
            continue
        mem = _TABLE_MEMORY.search(line)
        if pending and mem:
            gpus.append(GpuInfo(pending, float(mem.group(2)), driver.group(1) if driver else None))
            pending = None
        if "Processes:" in line:
            break
    return gpus


# ---------------------------------------------------------------------------------------------- the host


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def visible_gpus(gpus: list[GpuInfo], environ: Mapping[str, str]) -> tuple[list[GpuInfo], str | None]:
    """The GPUs a process started with `environ` can use, and why when that is not all nvidia-smi lists
    (nvidia-smi ignores CUDA_VISIBLE_DEVICES): `DS_ACCELERATOR` other than cuda makes DeepSpeed use another
    accelerator; `CUDA_VISIBLE_DEVICES` empty or -1 hides every GPU, a list keeps those indices (up to the
    first invalid one, as CUDA reads it) or, for UUIDs and MIG names, that many of the first model."""
    accelerator = environ.get("DS_ACCELERATOR")
    if accelerator and accelerator != "cuda" and gpus:
        return [], f"DS_ACCELERATOR={accelerator}: DeepSpeed will not use the {len(gpus)} GPUs"
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not gpus:
        return gpus, None
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    kept: list[GpuInfo] = []
    for entry in entries:
        if entry.lstrip("-").isdigit():
            index = int(entry)
            if not 0 <= index < len(gpus):
                break
            kept.append(gpus[index])
        else:
            kept.append(gpus[0])
    return kept, f"CUDA_VISIBLE_DEVICES={visible!r}: {len(kept)} of {len(gpus)} GPUs visible"


def run_nvidia_smi() -> str | None:
    """nvidia-smi's CSV query output, or None when there is no nvidia-smi or it fails (no driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, f"--query-gpu={','.join(NVIDIA_SMI_QUERY)}", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def meminfo_gib(text: str | None, key: str) -> float | None:
    m = re.search(rf"^{key}:\s*(\d+) kB", text or "", re.M)
    return int(m.group(1)) * 1024 / GIB if m else None


def host_memory_gib(root: Path = Path("/")) -> float | None:
    """MemTotal of /proc/meminfo in GiB, or None when it cannot be read."""
    return meminfo_gib(read_text(root / "proc/meminfo"), "MemTotal")


def cpu_rank_memory_gib(total_gib: float, ranks: int) -> float:
    """Memory one CPU rank may plan with: the ranks share the host's memory, and a tenth stays for the OS,
    the page cache and the launcher."""
    return round(0.9 * total_gib / ranks, 2)


def numa_nodes(root: Path) -> int:
    nodes = list((root / "sys/devices/system/node").glob("node[0-9]*"))
    return max(len(nodes), 1)


def disk_free(path: Path, root: Path) -> tuple[float | None, bool]:
    """Free GiB at `path` and whether it lives on an NVMe device (from /proc/mounts)."""
    try:
        free = shutil.disk_usage(path).free / GIB
    except OSError:
        return None, False
    device, best = "", -1
    resolved = str(path.resolve())
    for line in (read_text(root / "proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) >= 2 and resolved.startswith(parts[1]) and len(parts[1]) > best:
            device, best = parts[0], len(parts[1])
    return free, "nvme" in device


def default_cpu_ranks(cpu: CpuInfo, numa_nodes: int) -> int:
    """One rank per NUMA node on a multi-socket host (DeepSpeed's own CPU default), else two ranks when there
    are two cores or more: each rank then gets its share of the cores as OpenMP threads."""
    if numa_nodes > 1:
        return min(numa_nodes, cpu.logical_cpus)
    return 2 if cpu.logical_cpus >= 2 else 1
