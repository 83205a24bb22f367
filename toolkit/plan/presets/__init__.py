"""Preset model and cluster descriptions, one YAML file each, with their sources in the file's comments.

The files are the single source (GPU figures in `gpus.yaml`, which cluster presets name with `gpu:`): `dstk presets` lists what is here, and `dstk calibrate` writes the `cpu`
cluster file in the same format.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

PRESET_DIR = Path(__file__).resolve().parent
Kind = str  # "models" | "clusters"


def preset_names(kind: Kind) -> list[str]:
    """Sorted preset names of one kind ("models" or "clusters")."""
    return sorted(p.stem for p in (PRESET_DIR / kind).glob("*.yaml"))


def preset_path(kind: Kind, name: str) -> Path | None:
    """Path of a preset file, or None when there is no preset of that name."""
    path = PRESET_DIR / kind / f"{name}.yaml"
    return path if path.is_file() else None


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


def cluster_gpu_fields(key: str, entry: dict[str, Any]) -> dict[str, Any]:
    """A gpus.yaml entry as the per-GPU fields of a cluster description: the 16-bit tensor peak (bf16, or
    fp16 where the GPU has no bf16), fp32 and fp8 peaks, HBM bandwidth, SMs, board power, and the memory a
    process can allocate (`usable_memory_gib`, where the table has it; a cluster description gives
    `gpu_memory_gib` itself otherwise)."""
    native = bool(entry.get("bf16_native")) and entry.get("bf16_tflops") is not None
    out: dict[str, Any] = {
        "gpu_peak_tflops": entry["bf16_tflops"] if native else entry["fp16_tflops"],
        "gpu_fp32_peak_tflops": entry["fp32_tflops"],
        "gpu_memory_gb_per_s": entry["memory_gb_per_s"],
        "gpu_sm_count": entry["sm_count"],
        "gpu_power_w": entry["tdp_w"],
    }
    if entry.get("fp8_tflops") is not None:
        out["gpu_fp8_peak_tflops"] = entry["fp8_tflops"]
    if entry.get("usable_memory_gib") is not None:
        out["gpu_memory_gib"] = entry["usable_memory_gib"]
    return out
