"""`dstk env`: library versions, accelerator and machine — stamped into every benchmark result."""

from __future__ import annotations

import argparse

from toolkit.commands import print_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def collect() -> dict[str, object]:
    """Versions (without importing heavy packages where metadata suffices) and the accelerator in use."""
    import os
    import platform
    from importlib import metadata

    from toolkit import __version__

    versions = {}
    for pkg in (
        "torch",
        "deepspeed",
        "transformers",
        "datasets",
        "accelerate",
        "tokenizers",
        "pydantic",
        "peft",
        "wandb",
        "numpy",
    ):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    info: dict[str, object] = {
        "dstk": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": versions,
    }
    try:
        import torch

        cuda = torch.cuda.is_available()
        info["accelerator"] = "cuda" if cuda else "cpu"
        info["devices"] = (
            [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
        )
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        info["accelerator"] = None
    from toolkit.host.local import detect

    det = detect()
    info["local_cluster"] = {
        "hardware": det.hardware,
        "fingerprint": det.fingerprint,
        "calibration": str(det.calibration) if det.calibration else None,
        "cluster": det.cluster,
        "sources": det.sources,
        "unknown": det.unknown,
        "warnings": det.warnings,
    }
    return info


def run(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        print_json(info)
        return 0
    local = info.pop("local_cluster")
    for key, value in info.items():
        if isinstance(value, dict):
            for k, v in value.items():
                print(f"{k:>14}: {v}")
        else:
            print(f"{key:>14}: {value}")
    print("\n--cluster local (detected from this machine):")
    for key, value in local["hardware"].items():
        print(f"{key:>14}: {value}")
    print(f"{'calibration':>14}: {local['calibration'] or 'none for this host (run dstk calibrate)'}")
    print("\n".join(field_lines(local["cluster"], local["sources"])))
    for line in local["unknown"]:
        print(f"  unknown: {line}")
    return 0


def field_lines(cluster: dict[str, object], sources: dict[str, str]) -> list[str]:
    """One line per field, YAML-like (`key: value  # source`): a value of any length (a dict of bandwidths)
    pushes only its own comment right, never into it; values are padded to the short ones' width."""

    def show(value: object) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
        return str(value)

    values = {k: show(v) for k, v in cluster.items()}
    key_w = max(map(len, values)) + 1
    value_w = max((len(v) for v in values.values() if len(v) <= 28), default=0)
    return [f"  {key + ':':<{key_w}} {v:<{value_w}}  # {sources.get(key, '-')}" for key, v in values.items()]
