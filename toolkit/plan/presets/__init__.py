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


def _whole_word(text: str, name: str) -> bool:
    """`text` occurs in `name` (case-insensitive) with no letter or digit touching either end: "NVIDIA L4"
    must not claim an L40, "NVIDIA A10" an A10G, nor "B200" a GB200."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(text)}(?![A-Za-z0-9])", name, re.IGNORECASE) is not None


def match_gpu(name: str) -> tuple[str, dict[str, Any]] | None:
    """The table entry whose `match` substring occurs in the nvidia-smi (or rocm-smi/amd-smi) name as whole
    words, and none of whose `exclude` names does (first wins), or None."""
    for key, entry in gpu_table().items():
        if any(_whole_word(x, name) for x in entry.get("exclude", [])):
            continue
        if any(_whole_word(m, name) for m in entry.get("match", [])):
            return key, entry
    return None


def cluster_gpu_fields(key: str, entry: dict[str, Any]) -> dict[str, Any]:
    """A gpus.yaml entry as the per-GPU fields of a cluster description: the 16-bit tensor peak (bf16, or
    fp16 where the GPU has no bf16), fp32, fp8, MXFP8 and NVFP4 peaks (those the GPU has), HBM bandwidth, SMs,
    board power, and the memory a process can allocate (`usable_memory_gib`, where the table has it; a cluster
    description gives `gpu_memory_gib` itself otherwise)."""
    native = bool(entry.get("bf16_native")) and entry.get("bf16_tflops") is not None
    out: dict[str, Any] = {
        "gpu_peak_tflops": entry["bf16_tflops"] if native else entry["fp16_tflops"],
        "gpu_fp32_peak_tflops": entry["fp32_tflops"],
        "gpu_memory_gb_per_s": entry["memory_gb_per_s"],
        "gpu_sm_count": entry["sm_count"],
        "gpu_power_w": entry["tdp_w"],
    }
    for column, field in (
        ("fp8_tflops", "gpu_fp8_peak_tflops"),
        ("mxfp8_tflops", "gpu_mxfp8_peak_tflops"),
        ("nvfp4_tflops", "gpu_nvfp4_peak_tflops"),
    ):
        if entry.get(column) is not None:
            out[field] = entry[column]
    if entry.get("usable_memory_gib") is not None:
        out["gpu_memory_gib"] = entry["usable_memory_gib"]
    return out
