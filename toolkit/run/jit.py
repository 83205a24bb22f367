"""DeepSpeed's just-in-time op builds: which ones a job needs, which are not built yet, and how long each
takes — said once, before the silence it would otherwise be — and `python -m toolkit.run.jit` to build them
at install time (`make install` does, so `dstk calibrate` and the first launch on a fresh machine start at once).

DeepSpeed compiles an op with ninja the first time a process needs it and caches it under
TORCH_EXTENSIONS_DIR (else ~/.cache/torch_extensions): `deepspeed_shm_comm` at every CPU job's
`init_distributed` (its shared-memory all-reduce), `cpu_adam` for ZeRO-Offload's optimizer, `async_io` for NVMe
offload, `fused_adam` on CUDA unless the config asks for torch's Adam. Measured on this machine kind (2 cores):
shm_comm ≈ 50 s, cpu_adam ≈ 70 s, async_io 4–7 min (docs/troubleshooting.md).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BUILD_S = {"deepspeed_shm_comm": 50, "cpu_adam": 70, "async_io": 300, "fused_adam": 60}
"""Seconds a first build took on a 2-core host (fused_adam: with nvcc, on a GPU node)."""
WHAT = {
    "deepspeed_shm_comm": "its CPU communication op (shm_comm)",
    "cpu_adam": "its CPU Adam for ZeRO-Offload (cpu_adam)",
    "async_io": "its NVMe I/O op (async_io)",
    "fused_adam": "its fused Adam (fused_adam)",
}


def extensions_dir(env: dict[str, str]) -> Path:
    return Path(env.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")


def built(op: str, env: dict[str, str]) -> bool:
    """Whether the op cache holds `op` already (torch's layout: OP/OP.so, or PYVERSION/OP/OP.so)."""
    root = extensions_dir(env)
    return any(root.glob(f"{op}/{op}.so")) or any(root.glob(f"*/{op}/{op}.so"))


def needed(accelerator: str, config: dict[str, Any] | None = None) -> list[str]:
    """The ops a job on `accelerator` with `config` builds at its start (none known for a config of None)."""
    ops = ["deepspeed_shm_comm"] if accelerator == "cpu" else []
    zero = (config or {}).get("zero_optimization") or {}
    devices = {(zero.get(k) or {}).get("device") for k in ("offload_optimizer", "offload_param")}
    params = ((config or {}).get("optimizer") or {}).get("params") or {}
    if (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme"):
        ops.append("cpu_adam")
    elif config is not None and accelerator == "cuda" and not params.get("torch_adam"):
        ops.append("fused_adam")
    if "nvme" in devices or "aio" in (config or {}):
        ops.append("async_io")
    return ops


def announcement(accelerator: str, config: dict[str, Any] | None, env: dict[str, str]) -> str | None:
    """One sentence for the ops this job will compile before it starts, or None when all are built."""
    todo = [op for op in needed(accelerator, config) if not built(op, env)]
    if not todo:
        return None
    seconds = sum(BUILD_S[op] for op in todo)
    what = ", ".join(WHAT[op] for op in todo)
    return (
        f"DeepSpeed compiles {what} before it starts: about {seconds} s on 2 cores, once (cached under "
        f"{extensions_dir(env)}; `make install` builds shm_comm ahead)"
    )


def prebuild() -> int:
    """Build the ops every job on this host's accelerator needs (the CPU's shm_comm), once."""
    import os

    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu" or built("deepspeed_shm_comm", dict(os.environ)):
        return 0
    print(f"building DeepSpeed's shm_comm op into {extensions_dir(dict(os.environ))} (about 50 s, once)")
    get_accelerator().create_op_builder("ShareMemCommBuilder").load(verbose=False)  # as deepspeed.comm does
    return 0


if __name__ == "__main__":
    from toolkit.run.chatter import quiet

    quiet()
    sys.exit(prebuild())
