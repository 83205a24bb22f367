"""Measure what the DeepSpeed engine really holds: unique bytes of every tensor its optimizer (and the model)
keeps, so `dstk estimate`'s model-state prediction can be checked against the engine.

Tensors are found by walking the optimizer object (DeepSpeed's wrappers keep flat buffers, partitions, fp32
masters and the wrapped torch optimizer's state in attributes) and the model's parameters, gradients and
ZeRO-3 partitions (`ds_tensor`); storages are counted once however many views point at them. Communication
buckets are reported apart: the estimate counts them as buffers, not model states.
"""

from __future__ import annotations

import collections
from typing import Any

_SKIP = {"module", "engine", "deepspeed", "timers", "mpu", "param_names", "_param_slice_mappings"}
_BUCKETS = ("ipg_buckets", "ipg_buffer")


def _walk(obj: Any, path: str, depth: int, out: list[tuple[str, Any]], seen: set[int]) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        if obj.is_leaf and obj.grad is not None:
            out.append((path + ".grad", obj.grad))
        if isinstance(getattr(obj, "ds_tensor", None), torch.Tensor):
            out.append((path + ".ds_tensor", obj.ds_tensor))
        return
    if depth > 7 or obj is None or isinstance(obj, (int, float, str, bool)) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        return
    if isinstance(obj, (list, tuple, collections.deque)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", depth + 1, out, seen)
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{path}[{k if isinstance(k, (int, str)) else type(k).__name__}]", depth + 1, out, seen)
        return
    if isinstance(obj, torch.optim.Optimizer):
        _walk(obj.state, path + ".state", depth + 1, out, seen)
        _walk(obj.param_groups, path + ".param_groups", depth + 1, out, seen)
        return
    module = type(obj).__module__ or ""
    if (module.startswith("deepspeed") or module.startswith("toolkit")) and hasattr(obj, "__dict__"):
        for k, v in vars(obj).items():
            if k not in _SKIP:
                _walk(v, f"{path}.{k}", depth + 1, out, seen)


def held_bytes(engine: Any) -> dict[str, int]:
    """{"model_states": bytes, "buckets": bytes} held by this rank's engine right now (device and host)."""
    tensors: list[tuple[str, Any]] = []
    _walk(engine.optimizer, "opt", 0, tensors, set())
    for p in engine.module.parameters():
        tensors.append(("param", p.data))
        if p.grad is not None:
            tensors.append(("param.grad", p.grad))
        if getattr(p, "ds_tensor", None) is not None:
            tensors.append(("param.ds_tensor", p.ds_tensor))
    totals = {"model_states": 0, "buckets": 0}
    seen: set[tuple[int, int]] = set()
    for path, t in tensors:
        if t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        kind = "buckets" if any(b in path for b in _BUCKETS) else "model_states"
        totals[kind] += storage.nbytes()
    return totals


def offload_bytes(engine: Any, nvme_path: str | None, rank: int) -> dict[str, int]:
    """ZeRO-Infinity's footprint on this rank as the engine allocated it: the host buffers of an offloading
    ZeRO-3 optimizer (DeepSpeed 0.19.8: the pinned gradient partitions, the `max_in_cpu` parameter buffer, the
    optimizer's swap buffers, the parameters' swap pool and write-back buffer) and the bytes of this rank's swap
    files under `nvme_path` — what `dstk estimate` predicts as host states + swap buffers and NVMe."""
    from pathlib import Path

    opt = engine.optimizer
    tensors = [
        getattr(opt, name, None) for name in ("grad_partitions_flat_buffer", "lp_param_contiguous_pin_buffer")
    ]
    swapper = getattr(opt, "optimizer_swapper", None)
    tensors += list(getattr(getattr(swapper, "swap_buffer_manager", None), "all_buffers", []))
    param_swapper = next(
        (p.nvme_swapper for p in engine.module.parameters() if getattr(p, "nvme_swapper", None)), None
    )
    tensors += [
        getattr(param_swapper, "buffers", None),
        getattr(param_swapper, "partitioned_swap_buffer", None),
    ]
    host = sum(t.numel() * t.element_size() for t in tensors if t is not None)
    files = Path(nvme_path).glob(f"zero_stage_3/*/rank{rank}/*") if nvme_path else []
    return {"host": host, "nvme": sum(f.stat().st_size for f in files if f.is_file())}
