"""Shared by the benchmark scripts: where results go and what every result records."""

from __future__ import annotations

import datetime as dt
import json
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def hardware_tag() -> str:
    """`cpu` or the GPU model, for result file names `<bench>_<hardware>_<date>.*`."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0).replace(" ", "-").lower()
    except ImportError:
        pass
    return f"cpu-{platform.machine()}"


def result_path(bench: str, suffix: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{bench}_{hardware_tag()}_{dt.date.today().isoformat()}.{suffix}"


def stamp() -> dict[str, Any]:
    """The command that made a result and the environment it ran in (`dstk env`)."""
    from toolkit.commands.env import collect

    return {
        "command": " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "env": collect(),
    }


def write_json(bench: str, data: dict[str, Any]) -> Path:
    path = result_path(bench, "json")
    path.write_text(json.dumps({**stamp(), **data}, indent=2, sort_keys=True) + "\n")
    return path
