"""Load model and cluster descriptions from preset names, YAML/JSON files, HF `config.json` or `--params N`.

Every failure becomes a one-line :class:`~toolkit.errors.UserError` naming the file and the field, so the CLI
can exit 2 without a traceback. Pydantic's errors are collected and reported together, once.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from toolkit.errors import UserError
from toolkit.plan import hf_config
from toolkit.plan.presets import preset_names, preset_path
from toolkit.plan.specs import ClusterSpec, ModelSpec
from toolkit.plan.traced import TracedModel, TraceNeeded, write_trace

M = TypeVar("M", bound=BaseModel)


def read_text(path: Path, expected: str = "a YAML or JSON file") -> str:
    """The text of a file the user named, or a one-line UserError saying why it cannot be read."""
    from toolkit.paths import read_user_text

    try:
        return read_user_text(path)  # UTF-8 with or without a byte-order mark, or UTF-16 with one
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected {expected}") from None
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8"
        ) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level is a mapping."""
    text = read_text(path)
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{path}: malformed YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise UserError(
            f"{path}: expected a mapping of field: value at the top level, got {type(data).__name__}"
        )
    return data


def describe_errors(
    source: str, exc: ValidationError, cls: type[BaseModel], labels: dict[str, str] | None = None
) -> str:
    """One line for all of pydantic's complaints, each naming its field (or its CLI flag, via `labels`)."""
    parts, flagged = [], []
    fields = list(cls.model_fields)
    unknown_without_hint = False
    # a misspelt field usually explains a "missing" one, so unknown fields come first
    for err in sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden"):
        name = ".".join(str(x) for x in err["loc"]) or "(top level)"
        field = (labels or {}).get(name, name)
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(field, fields, n=1)
            unknown_without_hint |= not close
            part = f"{field}: unknown field" + (f" (did you mean {close[0]}?)" if close else "")
        elif err["type"] == "missing":
            part = f"{field}: required field missing"
        elif err["type"] == "value_error":
            part = str(err["ctx"]["error"])
            # a model-level check that names a field the user gave by flag: said with the flag
            for key, label in (labels or {}).items():
                if label.startswith("--") and part.startswith(f"{key}:"):
                    field, part = label, label + part[len(key) :]
                    break
        else:
            part = f"{field}: {err['msg'].lower()} (got {err.get('input')!r})"
        # a value the user gave by flag is theirs, not the description's: named by the flag alone
        (flagged if field.startswith("--") else parts).append(part)
    if unknown_without_hint:  # the valid names once, not after every unknown one
        parts.append(f"valid fields: {', '.join(fields)}")
    return "; ".join(flagged + ([f"{source}: " + "; ".join(parts)] if parts else []))


def build(cls: type[M], data: dict[str, Any], source: str, labels: dict[str, str] | None = None) -> M:
    """Validate `data` into `cls`, turning pydantic's errors into one UserError line."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise UserError(describe_errors(source, exc, cls, labels)) from None


LOCAL = "local"
"""The cluster name that means "detect this machine", usable wherever a preset is. The planner reads
descriptions only: detection is toolkit.host.local's, whose `load_cluster` hands the detected description here."""


def _resolve(kind: str, ref: str, detected: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    if kind == "clusters" and ref == LOCAL:
        if detected is None:
            raise ValueError("--cluster local is detected by toolkit.host.local.load_cluster, not here")
        return dict(detected), "cluster local (detected)"
    path = preset_path(kind, ref)
    if path is not None:
        data = read_mapping(path)
        return (with_gpu_figures(data, f"preset {ref}") if kind == "clusters" else data), f"preset {ref}"
    what = "model" if kind == "models" else "cluster"
    candidate = Path(ref).expanduser()
    if kind == "models" and candidate.is_dir() and (candidate / "config.json").is_file():
        candidate = candidate / "config.json"  # an HF model folder: its config.json describes it
    if candidate.exists() or candidate.suffix in (".yaml", ".yml", ".json"):
        try:
            data = read_mapping(candidate)
        except UserError as exc:
            raise UserError(f"--{what}: {exc}") from None
        _not_a_deepspeed_config(data, candidate, what)
        return (with_gpu_figures(data, str(candidate)) if kind == "clusters" else data), str(candidate)
    names = preset_names(kind) + ([LOCAL] if kind == "clusters" else [])
    folded = {n.lower(): n for n in names}
    close = (
        ([folded[ref.lower()]] if ref.lower() in folded else [])
        or [n for n in names if n.startswith(ref)]
        or difflib.get_close_matches(ref.lower(), names, n=1)
    )
    hint = f"did you mean {close[0]}? " if close else ""
    raise UserError(
        f"--{what}: {ref!r} is neither a preset nor an existing file; {hint}presets: {', '.join(names)}"
    )


_DEEPSPEED_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "optimizer",
    "scheduler",
)


def _not_a_deepspeed_config(data: dict[str, Any], path: Path, what: str) -> None:
    """A DeepSpeed config given where a description goes is the likeliest mix-up of two JSON files: say that,
    instead of one "unknown field" per DeepSpeed key."""
    keys = [k for k in _DEEPSPEED_KEYS if k in data]
    if keys:
        raise UserError(
            f"--{what}: {path} looks like a DeepSpeed config ({', '.join(keys[:3])}), not a {what} description; "
            f"give it as --config, and the {what} as --{what}"
        )
    gpus = [k for k, v in data.items() if isinstance(v, dict) and "bf16_tflops" in v]
    if gpus and len(gpus) == len(
        data
    ):  # the GPU table (or a copy of it), one "unknown field" per GPU otherwise
        raise UserError(
            f"--{what}: {path} looks like a table of GPUs ({', '.join(gpus[:3])}, ...), not a {what} description; "
            f"a cluster file names its GPU with gpu: {gpus[0]} (presets/gpus.yaml keys)"
        )


Tracer = Callable[[dict[str, Any], str], TracedModel]
"""Traces an HF config the family table does not know (the run half's `toolkit/run/trace.py`, handed in by the
command layer: the planning half never imports it)."""


def load_model(ref: str, overrides: dict[str, Any] | None = None, tracer: Tracer | None = None) -> ModelSpec:
    """A model from a preset name, a dstk YAML/JSON file or an HF `config.json`, with field overrides. An HF
    config of a model type the family table has no entry for is read from its cached trace; without one, it is
    traced by `tracer` (and cached), or refused in one line when no tracer is given."""
    data, source = _resolve("models", ref)
    if hf_config.is_hf_config(data):
        if Path(source).name == "config.json" and not data.get("_name_or_path"):
            data = {**data, "_name_or_path": Path(source).absolute().parent.name}  # an HF folder's own name
        original = data
        try:
            data = hf_config.from_hf_config(data, source)
        except TraceNeeded as need:
            if tracer is None:
                raise UserError(
                    f"{source}: model_type {need.config.get('model_type')!r} has no entry in dstk's family table "
                    "and has not been traced yet; `dstk estimate --model` it once (it needs transformers)"
                ) from None
            write_trace(tracer(need.config, source))
            data = hf_config.from_hf_config(data, source)
        if "trace" not in data:
            data["hf_config_json"] = hf_config.source_json(original)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    data.update(given)
    return build(ModelSpec, data, source, labels={k: f"--{k.replace('_', '-')}" for k in given})


def model_from(
    ref: str | None, params: float | None, seq_length: int | None = None, tracer: Tracer | None = None
) -> ModelSpec:
    """The model `--model REF` or `--params N` (one of them) names, with `--seq-length`."""
    if params is not None:
        return model_from_params(params, **({"seq_length": seq_length} if seq_length else {}))
    assert ref is not None
    return load_model(ref, {"seq_length": seq_length}, tracer)


def with_gpu_figures(data: dict[str, Any], source: str) -> dict[str, Any]:
    """A cluster description that names its GPU (`gpu: h100-sxm5-80gb`, a key of presets/gpus.yaml) gets the
    per-GPU figures from that table, the one place they are kept; stating one of them beside `gpu:` as well is
    refused, so the two can never disagree again."""
    if "gpu" not in data:
        return data
    from toolkit.plan.presets import cluster_gpu_fields, gpu_table

    data = dict(data)
    key = data.pop("gpu")
    table = gpu_table()
    if key not in table:
        raise UserError(f"{source}: gpu: {key!r} is not in presets/gpus.yaml; known: {', '.join(table)}")
    figures = cluster_gpu_fields(key, table[key])
    both = sorted(set(figures) & set(data))
    if both:
        raise UserError(
            f"{source}: {', '.join(both)}: given beside gpu: {key} (the table's figures); drop one of them"
        )
    return {**figures, **data}


def load_cluster(
    ref: str, overrides: dict[str, Any] | None = None, detected: Mapping[str, Any] | None = None
) -> ClusterSpec:
    """A cluster from a preset name or a YAML/JSON file, with field overrides such as `nodes`; `detected` is
    this machine's description when `ref` is `local` (toolkit.host.local.load_cluster passes it)."""
    data, source = _resolve("clusters", ref, detected)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if "nodes" in given and "hostnames" in data and "hostnames" not in given:
        data.pop("hostnames")  # a preset's host list no longer applies once the node count changes
    data.update(given)
    return build(ClusterSpec, data, source, labels={k: f"--{k.replace('_', '-')}" for k in given})


def _gpt_layer_params(hidden: int) -> int:
    """One GPT-2-style block: 12h² weights + 13h biases and norms (attention 4h²+4h, MLP 8h²+5h, 2 LNs 4h)."""
    return 12 * hidden * hidden + 13 * hidden


def model_from_params(
    n_params: float, seq_length: int = 2048, vocab_size: int = 50257, name: str | None = None
) -> ModelSpec:
    """A GPT-3-shaped model with as close to `n_params` parameters as integer shapes allow.

    Brown et al. 2020 (Table 2.1) keep head dim 128 and width/depth ≈ 128 from 6.7B up, and ≈ 64-85 below.
    We search widths whose head count is a multiple of 8 (4 below 1B) so tensor parallelism divides it, solve
    the depth for each, and among shapes within 0.5 % of the target take the one whose aspect ratio is
    closest to that trend.
    """
    if not math.isfinite(n_params) or not 1e6 <= n_params <= 1e14:
        raise UserError(f"--params: {n_params:g} is out of range; valid: 1e6 .. 1e14 parameters")
    head_dim = 128 if n_params >= 2e9 else 64
    target_aspect = 128 if n_params >= 5e9 else 80 if n_params >= 1e9 else 64
    best: tuple[float, float, int, int] | None = None
    step = (8 if n_params >= 1e9 else 4) * head_dim
    for hidden in range(step, 131072 + 1, step):
        fixed = vocab_size * hidden + seq_length * hidden + 2 * hidden
        layers = round((n_params - fixed) / _gpt_layer_params(hidden))
        if layers < 1:
            break
        error = abs(fixed + layers * _gpt_layer_params(hidden) - n_params) / n_params
        score = (
            0.0 if error <= 0.005 else error,
            abs(math.log(hidden / layers / target_aspect)),
            hidden,
            layers,
        )
        best = score if best is None or score < best else best
    if best is None:
        raise UserError(f"--params: {n_params:g} is too small for a GPT with a {vocab_size}-token vocabulary")
    _, _, hidden, layers = best
    label = name or f"gpt-{n_params / 1e9:g}b"
    return ModelSpec(
        name=label,
        architecture="gpt2",
        n_layers=layers,
        hidden_size=hidden,
        n_heads=hidden // head_dim,
        vocab_size=vocab_size,
        seq_length=seq_length,
        max_position_embeddings=seq_length,
        activation="gelu",  # GPT-3 as Megatron-LM trains it: a fused GeLU kernel
    )
