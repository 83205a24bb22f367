"""`--cluster local`: a cluster description detected from the machine dstk runs on.

A frozen preset describes one host; a user's host may be another GPU model, another GPU count, or a CPU
without native bf16 (where torch's bf16 matmul is ~75× slower than fp32: 0.8 vs 60 GFLOP/s per core on an
AVX2-only AMD EPYC, measured 2026-12-03). Detection reads what the machine says about itself, without
importing torch (the planning half must start in milliseconds):

- GPUs: `nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv` (the default
  table output parses too, for recorded fixtures), each model looked up in `presets/gpus.yaml` — published
  dense peaks, HBM bandwidth, NVLink/PCIe, bf16 support, each with its source;
- CPUs: `/proc/cpuinfo` (model, flags: `avx512_bf16`, `amx_bf16`, `avx512f`, `avx2`, `fma`; clock),
  NUMA nodes from sysfs, host memory from `/proc/meminfo`, free disk at the checkpoint path;
- a host fingerprint (CPU model and flags, cores, GPU model and driver, torch/DeepSpeed versions from package
  metadata) keying the cache that `dstk calibrate` writes: a matching calibration replaces the table values.

Every field says where it came from (`Detection.sources`); what could not be known is listed in
`Detection.unknown` with the value assumed, never guessed silently.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from toolkit.presets import PRESET_DIR

GIB = 2**30

NVIDIA_SMI_QUERY = ("name", "memory.total", "driver_version", "compute_cap")

# bf16 emulation cost on a CPU without avx512_bf16/amx_bf16: torch 2.13's bf16 matmul falls back to a
# reference kernel. 1024² on one core of an AVX2-only AMD EPYC: 0.8 GFLOP/s against 60 GFLOP/s fp32
# (ratio 75), measured 2026-12-03 and re-measured by `dstk calibrate` on the host itself.
EMULATED_BF16_SLOWDOWN = 75.0

# Defaults for the CPU accelerator's host-side figures that only a measurement knows (eager-op cost, gloo
# bandwidth, engine overheads): the `cpu` preset is a calibration of a 2-core host of this machine kind.
CPU_MEASURED_FIELDS = (
    "gpu_matmul_efficiency",
    "attention_efficiency",
    "gpu_memory_gb_per_s",
    "intra_node_gb_per_s",
    "collective_bus_gb_per_s",
    "collective_latency_us",
    "kernel_launch_us",
    "step_overhead_ms",
    "framework_overhead_gib",
    "optimizer_ns_per_param",
    "pcie_gb_per_s",
    "cpu_memory_gb_per_s",
    "storage_gb_per_s",
)


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


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi reports it."""

    name: str
    memory_mib: float | None
    driver: str | None = None
    compute_cap: str | None = None


@dataclass
class Detection:
    """A detected cluster description (ClusterSpec fields), where each value came from, and what is unknown."""

    cluster: dict[str, Any]
    sources: dict[str, str]
    unknown: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    fingerprint: str = ""
    calibration: Path | None = None
    hardware: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for stderr: what was detected and whether a calibration was used."""
        c = self.cluster
        what = self.hardware.get("gpu") or self.hardware.get("cpu", "?")
        basis = f"calibrated ({self.calibration})" if self.calibration else "table values, not calibrated"
        line = f"cluster local: {c['gpus_per_node']} × {c['accelerator']} ({what}); {basis}"
        if not self.calibration:
            line += "; run `dstk calibrate` for measured figures"
        return line


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
_TABLE_DRIVER = re.compile(r"Driver Version:\s*([0-9.]+)")


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


@cache
def gpu_table() -> dict[str, dict[str, Any]]:
    """Published per-GPU figures (presets/gpus.yaml), in match order."""
    return yaml.safe_load((PRESET_DIR / "gpus.yaml").read_text())


def match_gpu(name: str) -> tuple[str, dict[str, Any]] | None:
    """The table entry whose `match` substring occurs in the nvidia-smi name (first wins), or None."""
    for key, entry in gpu_table().items():
        for m in entry.get("match", []):
            # whole words: "NVIDIA L4" must not claim an L40, nor "NVIDIA A10" an A10G
            if re.search(rf"{re.escape(m)}(?![A-Za-z0-9])", name, re.IGNORECASE):
                return key, entry
    return None


# ---------------------------------------------------------------------------------------------- the host


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


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


def _meminfo_gib(text: str | None, key: str) -> float | None:
    m = re.search(rf"^{key}:\s*(\d+) kB", text or "", re.M)
    return int(m.group(1)) * 1024 / GIB if m else None


def _numa_nodes(root: Path) -> int:
    nodes = list((root / "sys/devices/system/node").glob("node[0-9]*"))
    return max(len(nodes), 1)


def _disk(path: Path, root: Path) -> tuple[float | None, bool]:
    """Free GiB at `path` and whether it lives on an NVMe device (from /proc/mounts)."""
    try:
        free = shutil.disk_usage(path).free / GIB
    except OSError:
        return None, False
    device, best = "", -1
    resolved = str(path.resolve())
    for line in (_read(root / "proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) >= 2 and resolved.startswith(parts[1]) and len(parts[1]) > best:
            device, best = parts[0], len(parts[1])
    return free, "nvme" in device


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in ("torch", "deepspeed"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def fingerprint(cpu: CpuInfo, gpus: list[GpuInfo], ranks: int, versions: dict[str, str | None]) -> str:
    """A short hash of what decides the measured figures: CPU model, ISA flags and cores; GPU models and
    driver; the rank count calibrated; torch and DeepSpeed versions."""
    isa = sorted(f for f in cpu.flags if re.match(r"(avx|amx|fma|sse4)", f))
    parts = [
        cpu.model,
        ",".join(isa),
        str(cpu.logical_cpus),
        ";".join(f"{g.name}/{g.memory_mib}/{g.driver}" for g in gpus),
        f"ranks={ranks}",
        f"torch={versions.get('torch')}",
        f"deepspeed={versions.get('deepspeed')}",
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    """Where calibrations are cached: $DSTK_CACHE_DIR, else $XDG_CACHE_HOME/dstk, else ~/.cache/dstk."""
    if os.environ.get("DSTK_CACHE_DIR"):
        return Path(os.environ["DSTK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dstk"


def calibration_path(fp: str) -> Path:
    return cache_dir() / "calibration" / f"{fp}.yaml"


def default_cpu_ranks(cpu: CpuInfo, numa_nodes: int) -> int:
    """One rank per NUMA node on a multi-socket host (DeepSpeed's own CPU default), else two ranks when there
    are two cores or more: each rank then gets its share of the cores as OpenMP threads."""
    if numa_nodes > 1:
        return min(numa_nodes, cpu.logical_cpus)
    return 2 if cpu.logical_cpus >= 2 else 1


def _cpu_preset() -> dict[str, Any]:
    return yaml.safe_load((PRESET_DIR / "clusters" / "cpu.yaml").read_text())


def _cpu_cluster(cpu: CpuInfo, ranks: int, det: Detection) -> None:
    """Peaks from the ISA and clock; host-side figures that only a measurement knows from the cpu preset."""
    cores = max(cpu.logical_cpus // ranks, 1)
    ghz = (cpu.mhz or 0) / 1e3
    if not ghz:
        ghz = 2.0
        det.unknown.append("CPU clock (cpu MHz missing from /proc/cpuinfo): assumed 2.0 GHz")
    fp32 = cpu.fp32_flops_per_cycle() * ghz * cores / 1e3
    bf16 = cpu.bf16_flops_per_cycle() * ghz * cores / 1e3
    isa = "AMX-BF16" if "amx_bf16" in cpu.flags else "AVX512-BF16" if cpu.bf16_native else "no native bf16"
    det.cluster.update(
        accelerator="cpu",
        gpus_per_node=ranks,
        gpu_peak_tflops=round(bf16, 5),
        gpu_fp32_peak_tflops=round(fp32, 5),
        supports_bf16=True,
        supports_fp16=False,
    )
    det.sources["gpu_peak_tflops"] = (
        f"/proc/cpuinfo: {isa}, {cpu.bf16_flops_per_cycle():g} bf16 FLOP/cycle × {ghz:.2f} GHz × {cores} cores"
        + ("" if cpu.bf16_native else f" (emulated: fp32 rate / {EMULATED_BF16_SLOWDOWN:g}, measured)")
    )
    det.sources["gpu_fp32_peak_tflops"] = (
        f"/proc/cpuinfo: {cpu.fp32_flops_per_cycle()} fp32 FLOP/cycle × {ghz:.2f} GHz × {cores} cores"
    )
    det.sources["gpus_per_node"] = (
        f"{cpu.logical_cpus} logical CPUs → {ranks} ranks of {cores} cores (one rank per NUMA node, else 2)"
    )
    preset = _cpu_preset()
    for key in CPU_MEASURED_FIELDS:
        if key in preset:
            det.cluster[key] = preset[key]
            det.sources[key] = "cpu preset (not measured on this host)"
    det.unknown.append(
        "host-side figures (eager-op cost, gloo bandwidth, engine overheads, matmul efficiency) are not "
        "measured on this host: taken from the cpu preset (a calibration of a 2-core host)"
    )
    det.warnings.append(
        "cluster local: not calibrated on this host; `dstk calibrate` measures it (under a minute) and "
        "--cluster local then uses the measurement"
    )


def _gpu_cluster(gpus: list[GpuInfo], det: Detection) -> None:
    """Per-GPU figures from the published table; what the table lacks is listed as unknown."""
    first = gpus[0]
    det.cluster.update(accelerator="cuda", gpus_per_node=len(gpus))
    det.sources["gpus_per_node"] = f"nvidia-smi: {len(gpus)} GPUs"
    if first.memory_mib:
        # the driver and ECC keep ~1 % of memory.total (A100-80GB: 81,920 MiB listed, ~79.2 GiB allocatable)
        det.cluster["gpu_memory_gib"] = round(0.99 * first.memory_mib / 1024, 1)
        det.sources["gpu_memory_gib"] = f"nvidia-smi memory.total {first.memory_mib:g} MiB, 1 % reserved"
    if len({g.name for g in gpus}) > 1:
        det.warnings.append(
            f"cluster local: mixed GPU models ({', '.join(sorted({g.name for g in gpus}))}); "
            f"planning for {first.name} on every rank"
        )
    found = match_gpu(first.name)
    if found is None:
        det.warnings.append(
            f"cluster local: unknown GPU model {first.name!r}: peak FLOP/s, HBM and interconnect bandwidth "
            "are not in dstk's table; run `dstk calibrate` or give them in a cluster file"
        )
        det.unknown += [
            "gpu_peak_tflops (assumed 100)",
            "gpu_fp32_peak_tflops",
            "gpu_memory_gb_per_s",
            "intra_node_gb_per_s (assumed PCIe, 20)",
            "supports_bf16 (assumed yes)",
        ]
        det.cluster.update(gpu_peak_tflops=100.0, intra_node_gb_per_s=20.0)
        det.cluster.setdefault("gpu_memory_gib", 16.0)
        return
    key, e = found
    native = bool(e.get("bf16_native")) and e.get("bf16_tflops") is not None
    peak = e["bf16_tflops"] if native else e["fp16_tflops"]
    src = e.get("source", "presets/gpus.yaml")
    link = e.get("nvlink_gb_per_s") or None
    # what NCCL's ring achieves (nccl-tests bus bandwidth) is ~78 % of the link rate: A100 NVLink 232 of
    # 300 GB/s, H100 ~370 of 450 (nccl issues #812/#1576, as in the cluster presets); PCIe likewise
    intra = 0.78 * (link or e.get("pcie_gb_per_s") or 16)
    det.cluster.update(
        gpu_peak_tflops=float(peak),
        gpu_fp32_peak_tflops=float(e["fp32_tflops"]),
        supports_bf16=native,
        supports_fp16=True,
        gpu_memory_gb_per_s=float(e["memory_gb_per_s"]),
        intra_node_gb_per_s=round(intra, 1),
        pcie_gb_per_s=round(0.78 * (e.get("pcie_gb_per_s") or 32), 1),
        gpu_power_w=float(e.get("tdp_w") or 400),
    )
    det.cluster.setdefault("gpu_memory_gib", round(0.99 * e["memory_gib"] * 1e9 / GIB, 1))
    for k in (
        "gpu_peak_tflops",
        "gpu_fp32_peak_tflops",
        "supports_bf16",
        "gpu_memory_gb_per_s",
        "gpu_power_w",
    ):
        det.sources[k] = f"table {key}: {src}"
    det.sources["intra_node_gb_per_s"] = (
        f"table {key}: {'NVLink' if link else 'PCIe'} {link or e.get('pcie_gb_per_s')} GB/s × 0.78 (NCCL ring)"
    )
    if e.get("sm_count"):
        det.cluster["gpu_sm_count"] = int(e["sm_count"])
        det.sources["gpu_sm_count"] = f"table {key}: {src}"


def detect(
    *,
    root: Path = Path("/"),
    nvidia_smi: str | None = None,
    cpuinfo: str | None = None,
    meminfo: str | None = None,
    checkpoint_path: Path | None = None,
    ranks: int | None = None,
    use_cache: bool = True,
    versions: dict[str, str | None] | None = None,
) -> Detection:
    """Describe this machine as a one-node cluster. Every input can be given (recorded outputs in tests);
    otherwise it is read from `root` and from running nvidia-smi."""
    if nvidia_smi is None and root == Path("/"):
        nvidia_smi = run_nvidia_smi()
    gpus = parse_nvidia_smi(nvidia_smi or "")
    cpu = parse_cpuinfo(cpuinfo if cpuinfo is not None else _read(root / "proc/cpuinfo") or "")
    meminfo = meminfo if meminfo is not None else _read(root / "proc/meminfo")
    det = Detection(cluster={"name": "local", "nodes": 1}, sources={})
    det.hardware = {
        "cpu": cpu.model,
        "cpu_flags": sorted(f for f in cpu.flags if re.match(r"(avx|amx|fma)", f)),
    }
    if gpus:
        det.hardware["gpu"] = f"{len(gpus)} × {gpus[0].name}"
        det.hardware["driver"] = gpus[0].driver
        _gpu_cluster(gpus, det)
        if ranks:
            det.cluster["gpus_per_node"] = ranks
    else:
        numa = _numa_nodes(root)
        _cpu_cluster(cpu, ranks or default_cpu_ranks(cpu, numa), det)
    total = _meminfo_gib(meminfo, "MemTotal")
    if total is None:
        det.unknown.append("host memory (/proc/meminfo unreadable): assumed 16 GiB")
        total = 16.0
    det.cluster["cpu_memory_gib"] = round(total, 1)
    det.sources["cpu_memory_gib"] = "/proc/meminfo MemTotal"
    if det.cluster["accelerator"] == "cpu":
        # the ranks share the host's memory; keep a tenth for the OS, page cache and the launcher
        det.cluster["gpu_memory_gib"] = round(0.9 * total / det.cluster["gpus_per_node"], 2)
        det.sources["gpu_memory_gib"] = "90 % of MemTotal shared by the ranks"
    free, on_nvme = _disk(checkpoint_path or Path.cwd(), root)
    det.hardware["disk_free_gib"] = None if free is None else round(free, 1)
    det.cluster["nvme_gib"] = round(free, 1) if (free and on_nvme) else 0
    det.sources["nvme_gib"] = (
        "free space on the NVMe device at the checkpoint path"
        if on_nvme
        else "checkpoint path is not on an NVMe device: no NVMe offload planned"
    )
    if gpus:
        det.unknown.append("inter_node_gb_per_s (one node detected): assumed 25 GB/s per GPU")
        det.cluster["inter_node_gb_per_s"] = 25.0
    else:
        det.cluster["inter_node_gb_per_s"] = det.cluster.get("intra_node_gb_per_s", 1.0)
    versions = versions if versions is not None else package_versions()
    det.fingerprint = fingerprint(cpu, gpus, det.cluster["gpus_per_node"], versions)
    path = calibration_path(det.fingerprint)
    if use_cache and path.is_file():
        measured = yaml.safe_load(path.read_text()) or {}
        measured.pop("name", None)
        det.cluster.update(measured)
        det.cluster["name"] = "local"
        det.calibration = path
        det.warnings = [w for w in det.warnings if "not calibrated" not in w]
        det.unknown = [u for u in det.unknown if not u.startswith("host-side")]
        for k in measured:
            det.sources[k] = f"measured by dstk calibrate ({path})"
    return det


@cache
def local_cluster_data() -> tuple[dict[str, Any], str, tuple[str, ...]]:
    """This process's detection of its own host (once): cluster fields, summary line, warnings."""
    det = detect()
    return dict(det.cluster), det.summary(), tuple(det.warnings)
