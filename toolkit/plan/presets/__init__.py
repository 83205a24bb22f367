"""Preset model and cluster descriptions, one YAML file each, with their sources in the file's comments.

The files are the single source: `dstk presets` lists what is here, and `dstk calibrate` writes the `cpu`
cluster file in the same format.
"""

from __future__ import annotations

from pathlib import Path

PRESET_DIR = Path(__file__).resolve().parent
Kind = str  # "models" | "clusters"


def preset_names(kind: Kind) -> list[str]:
    """Sorted preset names of one kind ("models" or "clusters")."""
    return sorted(p.stem for p in (PRESET_DIR / kind).glob("*.yaml"))


def preset_path(kind: Kind, name: str) -> Path | None:
    """Path of a preset file, or None when there is no preset of that name."""
    path = PRESET_DIR / kind / f"{name}.yaml"
    return path if path.is_file() else None
