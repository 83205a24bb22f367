"""Read a DeepSpeed config someone else wrote the way DeepSpeed reads it, and check the types it reads raw.

Real configs arrive as Megatron-DeepSpeed templates with `CONFIG_BATCH_SIZE` still in them, autotuning files
with `"stage": [0, 1, 2, 3]`, and hand edits with comments. DeepSpeed (runtime/config.py, 0.19.8) reads a file
with `hjson.load(..., object_pairs_hook=dict_raise_error_on_duplicate_keys)` and then reads most top-level
fields raw, so a string where a number goes ends in `TypeError: '>' not supported between instances of 'str'
and 'int'`. `read_ds_config` reads the same syntax (strict JSON first; hjson, DeepSpeed's parser, only for files
that are not — it comes with DeepSpeed) and names an unfilled placeholder; `type_problems` names each wrong
type with what DeepSpeed needs there. `"auto"` is `ds_auto`'s, the batch arithmetic `ds_layout`'s.

Standard library only (hjson lazily): `dstk estimate --config` uses it without DeepSpeed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.integrations.targets import get_path
from toolkit.plan.load import read_text

AUTO = "auto"

_PLACEHOLDER = re.compile(
    r'^\s*"(?P<key>[^"]+)"\s*:\s*(?P<token>\$\{?[A-Za-z_]\w*\}?|[A-Z][A-Z0-9_]*[A-Z0-9])\s*,?\s*$', re.M
)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def read_ds_config(path: Path) -> dict[str, Any]:
    """The config at `path` as DeepSpeed would read it; a one-line UserError for anything DeepSpeed refuses."""
    text = read_text(path, "a DeepSpeed JSON config")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise UserError(f"{path}: duplicate key {exc.args[0]!r} (DeepSpeed refuses duplicate keys)") from None
    except json.JSONDecodeError as exc:
        data = _not_json(path, text, exc)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


def _not_json(path: Path, text: str, exc: json.JSONDecodeError) -> Any:
    """A file strict JSON refuses: an unfilled template, or hjson (comments, trailing commas) DeepSpeed reads."""
    holes = [(m["key"], m["token"]) for m in _PLACEHOLDER.finditer(text)]
    if holes:
        key, token = holes[0]
        more = (
            f" (and {len(holes) - 1} more: {', '.join(t for _, t in holes[1:4])})" if len(holes) > 1 else ""
        )
        raise UserError(
            f"{path}: {key}: {token} is an unfilled template placeholder{more}; replace it with a value as the "
            "template's launch script does (sed) before validating or launching"
        )
    try:
        import hjson
    except ImportError:  # the planning half alone: DeepSpeed (and its parser) not installed
        raise UserError(
            f"{path}: not strict JSON at line {exc.lineno}: {exc.msg} (DeepSpeed also reads hjson; install "
            "dstk[run] to read it here)"
        ) from None
    try:
        return hjson.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as dup:
        raise UserError(f"{path}: duplicate key {dup.args[0]!r} (DeepSpeed refuses duplicate keys)") from None
    except hjson.HjsonDecodeError as bad:
        raise UserError(
            f"{path}: malformed config at line {bad.lineno}: {bad.msg} (neither JSON nor hjson, which DeepSpeed reads)"
        ) from None


# ---- types of the fields DeepSpeed reads raw -----------------------------------------------------------------

_POSITIVE_INTS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "sequence_parallel_size",
    "pipeline.stages",
    "tensor_parallel.autotp_size",
)
_NUMBERS = ("gradient_clipping",)
_BOOLS = ("fp16.enabled", "bf16.enabled", "bfloat16.enabled")


def scheduled_steps(cfg: dict[str, Any]) -> Any:
    """The schedule's `total_num_steps` (what `dstk train` runs when --steps is not given), or None."""
    return get_path(cfg, "scheduler.params.total_num_steps")


def integral(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer()
    )


def type_problems(cfg: dict[str, Any]) -> list[str]:
    """Fields DeepSpeed reads without a schema (a wrong type there is a TypeError deep inside it), named."""
    problems = []
    for path in _POSITIVE_INTS:
        value = get_path(cfg, path)
        if value is not None and not (integral(value) and value > 0):
            problems.append(
                f"{path}: {json.dumps(value)} is not a positive integer, which DeepSpeed needs here"
            )
    for path in _NUMBERS:
        value = get_path(cfg, path)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            problems.append(f"{path}: {json.dumps(value)} is not a number, which DeepSpeed needs here")
    for path in _BOOLS:
        value = get_path(cfg, path)
        if value is not None and not isinstance(value, bool):
            # DeepSpeed takes any truthy value as true: "false" or "auto" would silently enable the mode
            problems.append(
                f"{path}: {json.dumps(value)} is not true or false (DeepSpeed would read it as {bool(value)})"
            )
    stage = get_path(cfg, "zero_optimization.stage")
    if stage is not None and not (integral(stage) and 0 <= stage <= 3):
        hint = (
            " (a list is an autotuning search space: set autotuning.enabled, or give one stage)"
            if isinstance(stage, list)
            else ""
        )
        problems.append(f"zero_optimization.stage: {json.dumps(stage)} is not one of 0, 1, 2, 3{hint}")
    for section in (
        "zero_optimization",
        "fp16",
        "bf16",
        "optimizer",
        "scheduler",
        "pipeline",
        "tensor_parallel",
    ):
        if section in cfg and not isinstance(cfg[section], dict):
            problems.append(f"{section}: {json.dumps(cfg[section])} is not an object of settings")
    return problems


def idle_comms_logger(config: dict[str, Any]) -> bool:
    """Whether `config` carries a `comms_logger` block that does not ask for the logger, which DeepSpeed 0.19.8
    switches on all the same: `deepspeed/comm/config.py` sets `comms_logger_enabled = 'comms_logger' in
    ds_config` and never consults `enabled` for that. A logger on synchronizes the device after every
    collective (`deepspeed/comm/comm.py`, `timed_op`) and re-reads every timer event recorded since the start
    (`deepspeed/utils/timer.py`, `elapsed(reset=False)`, never cleared): the per-step cost grows with the step
    count (measured on CPU, DeepSpeed's wrapper alone, 41 all-reduces a step: 4.7 → 18 ms per step over 300
    steps, 0.8 ms flat without the key). dstk configs before this check carried `{"enabled": false}`."""
    block = config.get("comms_logger")
    if "comms_logger" not in config:
        return False
    return not (isinstance(block, dict) and block.get("enabled") is True)


def without_idle_comms_logger(config: dict[str, Any]) -> dict[str, Any]:
    """`config` without a `comms_logger` block that does not ask for the logger (see `idle_comms_logger`)."""
    if not idle_comms_logger(config):
        return config
    return {k: v for k, v in config.items() if k != "comms_logger"}
