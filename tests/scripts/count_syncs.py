"""Run `dstk train` on this rank with every device-to-host wait that dstk's own code makes counted per step.

    deepspeed --num_gpus 2 --no_local_rank tests/scripts/count_syncs.py OUT [dstk train flags ...]

Counted, when the call comes from a frame in `toolkit/` (DeepSpeed's own waits are DeepSpeed's): the
accelerator's `synchronize`, an accelerator event's `synchronize`, reads of tensor values (`item`, `tolist`,
`__float__`, `__int__`, `__bool__`, `cpu`, `numpy`) and `.to(...)` device copies without `non_blocking=True`.
On the CPU accelerator none of these waits for anything, which is why they are counted instead of timed: on a
GPU each one drains the device's queue. A step's window runs from the start of its `_train_step` to the start
of the next one, so the read of its record and whatever the loop does after it count for it. Writes
OUT/syncs-rank{R}.json: {"steps": {step: {kind: n}}, "deepspeed_synchronize": n} before the rank exits.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
TOOLKIT = str(REPO / "toolkit") + "/"

counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
state = {"step": 0, "deepspeed_synchronize": 0}


def _from_toolkit() -> bool:
    return sys._getframe(2).f_code.co_filename.startswith(TOOLKIT)


def _count(kind: str) -> None:
    counts[state["step"]][kind] += 1


def _wrap_read(name: str) -> None:
    import torch

    original = getattr(torch.Tensor, name)

    def wrapper(self, *args, **kwargs):
        if _from_toolkit():
            _count("read")
        return original(self, *args, **kwargs)

    setattr(torch.Tensor, name, wrapper)


def _is_device(arg: object) -> bool:
    import torch

    return isinstance(arg, (torch.device, str, torch.Tensor))


def install() -> None:
    import deepspeed
    import torch

    for name in ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy"):
        _wrap_read(name)
    to = torch.Tensor.to

    def to_wrapper(self, *args, **kwargs):
        device = kwargs.get("device", args[0] if args else None)
        if _from_toolkit() and _is_device(device) and kwargs.get("non_blocking") is not True:
            _count("blocking_copy")
        return to(self, *args, **kwargs)

    torch.Tensor.to = to_wrapper
    accel = deepspeed.get_accelerator()
    synchronize = accel.synchronize

    def sync_wrapper(*args, **kwargs):
        if sys._getframe(1).f_code.co_filename.startswith(TOOLKIT):
            _count("synchronize")
        else:
            state["deepspeed_synchronize"] += 1
        return synchronize(*args, **kwargs)

    accel.synchronize = sync_wrapper

    from toolkit.run import loop

    train_step = loop.Trainer._train_step

    def step_wrapper(trainer, *args, **kwargs):
        state["step"] = trainer.step + 1
        return train_step(trainer, *args, **kwargs)

    loop.Trainer._train_step = step_wrapper


def main(out: Path, argv: list[str]) -> int:
    import os

    from toolkit.run import runtime

    install()
    exit_without_teardown = runtime.exit_without_teardown

    def write_then_exit(code: int = 0) -> None:
        rank = os.environ.get("RANK", "0")
        record = {"steps": {s: dict(c) for s, c in counts.items()}, **state}
        (out / f"syncs-rank{rank}.json").write_text(json.dumps(record, indent=1))
        exit_without_teardown(code)

    runtime.exit_without_teardown = write_then_exit
    from toolkit.cli import main as dstk

    return dstk(["train", *argv])


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.exit(main(out_dir, sys.argv[2:]))
