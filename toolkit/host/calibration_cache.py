"""The cache `dstk calibrate` writes and `--cluster local` reads: one YAML per host fingerprint, so a
calibration measured on one machine kind (or with other torch/DeepSpeed versions) is never applied to
another."""

from __future__ import annotations

import hashlib
import re
from importlib import metadata
from pathlib import Path

from toolkit.host.detect import CpuInfo, GpuInfo
from toolkit.plan.cache import cache_dir


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


def calibration_path(fp: str) -> Path:
    return cache_dir() / "calibration" / f"{fp}.yaml"
