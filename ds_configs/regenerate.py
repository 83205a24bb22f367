"""Regenerate every reference config in this folder from the arguments in scenarios.yaml."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def scenarios() -> dict[str, dict[str, str]]:
    return yaml.safe_load((HERE / "scenarios.yaml").read_text())


def main() -> int:
    from toolkit.cli import main as dstk

    for name, spec in scenarios().items():
        code = dstk(["config", *shlex.split(spec["args"]), "-o", str(HERE / f"{name}.json")])
        if code:
            print(f"{name}: dstk config exited {code}", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
