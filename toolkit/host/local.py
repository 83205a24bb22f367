"""`--cluster local`: this machine as a one-node cluster description, from what `toolkit.host.detect` reads
(nvidia-smi, /proc/cpuinfo, /proc/meminfo, the GPU table) and, when `dstk calibrate` ran on this host, its
cached measurement. Every field says where it came from; what could not be known is listed, not guessed."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from toolkit.host.amd_smi import parse_amd_smi, run_amd_smi
from toolkit.host.calibration_cache import calibration_path, fingerprint, package_versions
from toolkit.host.detect import (
    EMULATED_BF16_SLOWDOWN,
    GIB,
    CpuInfo,
    GpuInfo,
    cpu_rank_memory_gib,
    default_cpu_ranks,
    disk_free,
    meminfo_gib,
    numa_nodes,
    onednn_isa_cap,
    parse_cpuinfo,
    parse_nvidia_smi,
    read_text,
    run_nvidia_smi,
    visible_gpus,
)
from toolkit.plan.presets import PRESET_DIR, cluster_gpu_fields, match_gpu

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
            line += "; `dstk calibrate` measures this host (30 s on 2 cores once DeepSpeed's CPU op is built) and --cluster local then uses it"
        return line


def _cpu_preset() -> dict[str, Any]:
    return yaml.safe_load((PRESET_DIR / "clusters" / "cpu.yaml").read_text())


def _cpu_cluster(cpu: CpuInfo, ranks: int, det: Detection, calibrated: bool) -> None:
    """Peaks from the ISA and clock; host-side figures that only a measurement knows from the cpu preset
    (said to be unknown unless this host's calibration will replace them)."""
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
    det.sources["accelerator"] = "no GPU found by nvidia-smi: the CPU accelerator"
    det.sources["supports_bf16"] = f"/proc/cpuinfo: {isa}" + ("" if cpu.bf16_native else " (bf16 emulated)")
    det.sources["supports_fp16"] = "the CPU accelerator trains in bf16 or fp32"
    det.sources["gpus_per_node"] = (
        f"{cpu.logical_cpus} logical CPUs → {ranks} ranks of {cores} cores (one rank per NUMA node, else 2)"
    )
    preset = _cpu_preset()
    for key in CPU_MEASURED_FIELDS:
        if key in preset:
            det.cluster[key] = preset[key]
            det.sources[key] = "cpu preset (not measured on this host)"
    if calibrated:
        return
    det.unknown.append(
        "host-side figures (eager-op cost, gloo bandwidth, engine overheads, matmul efficiency) are not "
        "measured on this host: taken from the cpu preset (a calibration of a 2-core host)"
    )


# The share of the GPU-to-GPU link rate NCCL's rings reach (nccl-tests bus bandwidth): ~78 % on NVLink (A100
# 232 of 300 GB/s, H100 ~370 of 450; nccl issues #812/#1576, as in the cluster presets) and PCIe; RCCL on
# MI300X's xGMI mesh 70 % (all-reduce busbw 312.9 of 7 × 64 = 448 GB/s on 8 GPUs; stas00/ml-engineering
# network/README.md, as in presets/clusters/mi300x-8.yaml).
RING_SHARE = {"xgmi": 0.70}
RING_SHARE_DEFAULT = 0.78


def _gpu_cluster(gpus: list[GpuInfo], det: Detection) -> None:
    """Per-GPU figures from the published table; what the table lacks is listed as unknown."""
    first = gpus[0]
    tool = first.tool
    # DeepSpeed drives ROCm's GPUs through its CUDA accelerator: PyTorch's HIP build is torch.cuda
    det.cluster.update(accelerator="cuda", gpus_per_node=len(gpus))
    det.sources["gpus_per_node"] = f"{tool}: {len(gpus)} GPUs"
    det.sources["accelerator"] = f"{tool}: {first.name}" + (
        "" if tool == "nvidia-smi" else " (ROCm: torch.cuda)"
    )
    if first.memory_mib:
        # the driver and ECC keep ~1 % of memory.total (A100-80GB: 81,920 MiB listed, ~79.2 GiB allocatable)
        det.cluster["gpu_memory_gib"] = round(0.99 * first.memory_mib / 1024, 1)
        det.sources["gpu_memory_gib"] = f"{tool} memory total {first.memory_mib:g} MiB, 1 % reserved"
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
    src = e.get("source", "presets/gpus.yaml")
    link = e.get("nvlink_gb_per_s") or None
    share = RING_SHARE.get(e.get("interconnect", ""), RING_SHARE_DEFAULT) if link else RING_SHARE_DEFAULT
    intra = share * (link or e.get("pcie_gb_per_s") or 16)
    # the table's figures as the cluster presets that name this GPU get them; memory is nvidia-smi's, above
    figures = {k: v for k, v in cluster_gpu_fields(key, e).items() if k != "gpu_memory_gib"}
    det.cluster.update(
        {k: v if k == "gpu_sm_count" else float(v) for k, v in figures.items()},
        supports_bf16=native,
        supports_fp16=True,
        intra_node_gb_per_s=round(intra, 1),
        pcie_gb_per_s=round(0.78 * (e.get("pcie_gb_per_s") or 32), 1),
    )
    for peak in ("gpu_fp8_peak_tflops", "gpu_mxfp8_peak_tflops", "gpu_nvfp4_peak_tflops"):
        if peak in figures:
            det.sources[peak] = f"table {key}: {src}"
    if e.get("interconnect") == "xgmi":  # one link per pair of GPUs, no switch (comm.py)
        det.cluster["intra_node_topology"] = "full_mesh"
        det.sources["intra_node_topology"] = f"table {key}: xGMI, a full mesh of the node's GPUs"
    if "gpu_memory_gib" not in det.cluster:
        usable = e.get("usable_memory_gib")
        det.cluster["gpu_memory_gib"] = usable or round(0.99 * e["memory_gib"] * 1e9 / GIB, 1)
        det.sources["gpu_memory_gib"] = (
            f"table {key}: {'usable_memory_gib' if usable else 'memory_gib, 1 % reserved'}"
        )
    for k in (
        "gpu_peak_tflops",
        "gpu_fp32_peak_tflops",
        "supports_bf16",
        "supports_fp16",
        "gpu_memory_gb_per_s",
        "gpu_power_w",
    ):
        det.sources[k] = f"table {key}: {src}"
    fabric = ("xGMI" if e.get("interconnect") == "xgmi" else "NVLink") if link else "PCIe"
    det.sources["intra_node_gb_per_s"] = (
        f"table {key}: {fabric} {link or e.get('pcie_gb_per_s')} GB/s × {share:g} (NCCL/RCCL ring)"
    )
    det.sources["gpu_sm_count"] = f"table {key}: {src}"


def detect(
    *,
    root: Path = Path("/"),
    nvidia_smi: str | None = None,
    amd_smi: str | None = None,
    cpuinfo: str | None = None,
    meminfo: str | None = None,
    checkpoint_path: Path | None = None,
    ranks: int | None = None,
    use_cache: bool = True,
    versions: dict[str, str | None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Detection:
    """Describe this machine as a one-node cluster. Every input can be given (recorded outputs in tests);
    otherwise it is read from `root` and from running nvidia-smi, or where it finds no GPU amd-smi/rocm-smi
    (`amd_smi`: their output). `environ` (this process's environment when /proc/cpuinfo is read live, else
    empty) supplies `ONEDNN_MAX_CPU_ISA`, which changes what bf16 costs."""
    live = nvidia_smi is None and root == Path("/")
    if live:
        nvidia_smi = run_nvidia_smi()
    gpus = parse_nvidia_smi(nvidia_smi or "")
    if not gpus:
        if live and amd_smi is None:
            amd_smi = run_amd_smi()
        gpus = parse_amd_smi(amd_smi or "")
    hidden = None
    if live:  # what this process may use, not all the box has
        gpus, hidden = visible_gpus(gpus, os.environ)
    cpu = parse_cpuinfo(cpuinfo if cpuinfo is not None else read_text(root / "proc/cpuinfo") or "")
    if environ is None:
        environ = os.environ if cpuinfo is None and root == Path("/") else {}
    cpu, capped = onednn_isa_cap(cpu, environ)
    meminfo = meminfo if meminfo is not None else read_text(root / "proc/meminfo")
    det = Detection(cluster={"name": "local", "nodes": 1}, sources={})
    if hidden:
        det.sources["gpus_per_node"] = hidden
    det.hardware = {
        "cpu": cpu.model,
        "cpu_flags": sorted(f for f in cpu.flags if re.match(r"(avx|amx|fma)", f)),
    }
    if capped:
        det.hardware["isa_cap"] = capped
    ranks = ranks or (len(gpus) if gpus else default_cpu_ranks(cpu, numa_nodes(root)))
    versions = versions if versions is not None else package_versions()
    det.fingerprint = fingerprint(cpu, gpus, ranks, versions)
    path = calibration_path(det.fingerprint)
    calibrated = use_cache and path.is_file()
    if gpus:
        det.hardware["gpu"] = f"{len(gpus)} × {gpus[0].name}"
        det.hardware["driver"] = gpus[0].driver
        _gpu_cluster(gpus, det)
        det.cluster["gpus_per_node"] = ranks
    else:
        _cpu_cluster(cpu, ranks, det, calibrated)
    total = meminfo_gib(meminfo, "MemTotal")
    if total is None:
        det.unknown.append("host memory (/proc/meminfo unreadable): assumed 16 GiB")
        total = 16.0
    det.cluster["cpu_memory_gib"] = round(total, 1)
    det.sources["cpu_memory_gib"] = "/proc/meminfo MemTotal"
    if det.cluster["accelerator"] == "cpu":
        # the ranks share the host's memory; keep a tenth for the OS, page cache and the launcher
        det.cluster["gpu_memory_gib"] = cpu_rank_memory_gib(total, ranks)
        det.sources["gpu_memory_gib"] = "90 % of MemTotal shared by the ranks"
    free, on_nvme = disk_free(checkpoint_path or Path.cwd(), root)
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
        det.sources["inter_node_gb_per_s"] = "assumed 25 GB/s per GPU (one node: not measured)"
    else:
        det.cluster["inter_node_gb_per_s"] = det.cluster.get("intra_node_gb_per_s", 1.0)
        det.sources["inter_node_gb_per_s"] = "intra_node_gb_per_s (one host: no traffic between nodes)"
    det.sources.setdefault("name", "--cluster local: this machine")
    det.sources.setdefault("nodes", "--cluster local: this machine")
    if calibrated:
        measured = yaml.safe_load(path.read_text()) or {}
        measured.pop("name", None)
        det.cluster.update(measured)
        det.calibration = path
        for k in measured:
            det.sources[k] = f"measured by dstk calibrate ({path})"
    return det


@cache
def local_cluster_data() -> tuple[dict[str, Any], str, tuple[str, ...]]:
    """This process's detection of its own host (once): cluster fields, summary line, warnings."""
    det = detect()
    return dict(det.cluster), det.summary(), tuple(det.warnings)


def load_cluster(ref: str, overrides: dict[str, Any] | None = None) -> Any:
    """The cluster a user names: `local` is this machine, detected here; any other name a preset or a file,
    read by toolkit.plan.load (which never detects: the planner reads descriptions)."""
    from toolkit.plan.load import LOCAL
    from toolkit.plan.load import load_cluster as load_description

    detected = local_cluster_data()[0] if ref == LOCAL else None
    return load_description(ref, overrides, detected)
