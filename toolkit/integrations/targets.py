"""One plan, written for the runtimes users already live in: HF Trainer, Accelerate and Megatron-DeepSpeed.

Each target starts from the DeepSpeed config :func:`toolkit.integrations.ds_config.build_ds_config` made for the resolved
layout (the config DeepSpeed's own classes validated) and changes only what that runtime owns, so the numbers
cannot drift apart: `hf_trainer` turns the values the Trainer fills from `TrainingArguments` into `"auto"` and
writes those arguments beside it, `accelerate` points a launcher YAML at the JSON, and `megatron` removes what
Megatron-DeepSpeed builds itself (TP, pipeline, optimizer, scheduler) and prints its arguments.

The `dstk` block (the layout and dstk's own optimizer, read by `dstk train`) is removed for every target.
DeepSpeed ignores unknown top-level keys and so does HF/Accelerate's "auto" processing (checked in
tests/test_ecosystem.py), but the block repeats batch sizes that the HF config leaves to `TrainingArguments`:
two places for one number is how configs come to disagree.
"""

from __future__ import annotations

import copy
from typing import Any

from toolkit.integrations.dstk_block import DSTK_KEY

TARGET_FLAGS = ("--hf-trainer", "--accelerate", "--megatron")


def without_dstk_block(cfg: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `cfg` without the `dstk` block."""
    out = copy.deepcopy(cfg)
    out.pop(DSTK_KEY, None)
    return out


def get_path(cfg: dict[str, Any], dotted: str) -> Any:
    """`cfg["a"]["b"]` for "a.b", or None when any level is missing (as HF's `find_config_node` reads it)."""
    node: Any = cfg
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def set_path(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    """Set an existing `cfg["a"]["b"]` for "a.b"."""
    *parents, last = dotted.split(".")
    node = cfg
    for key in parents:
        node = node[key]
    node[last] = value
