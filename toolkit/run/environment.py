"""The environment a run or a benchmark measured in: dstk, Python and library versions, the accelerator torch
sees, and this machine as `--cluster local` detects it (`dstk env`; stamped into every benchmark result)."""

from __future__ import annotations

PACKAGES = (
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
)


def collect() -> dict[str, object]:
    """Versions (without importing heavy packages where metadata suffices) and the accelerator in use."""
    import os
    import platform
    from importlib import metadata

    from toolkit import __version__

    versions: dict[str, str | None] = {}
    for pkg in PACKAGES:
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
    keys = ("hardware", "fingerprint", "cluster", "sources", "unknown", "warnings")
    calibration = str(det.calibration) if det.calibration else None
    info["local_cluster"] = {**{k: getattr(det, k) for k in keys}, "calibration": calibration}
    return info
