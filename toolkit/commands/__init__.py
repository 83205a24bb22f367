"""CLI verbs and the argument groups they share.

Flags are derived from the pydantic fields they set (names, choices, help text), so the help and the specs
cannot drift apart.
"""

from __future__ import annotations

import argparse
import re
import sys
import typing
from typing import Any, NoReturn

# verb -> (module under toolkit.commands, one-line summary)
VERBS: dict[str, tuple[str, str]] = {
    "estimate": ("estimate", "Predict memory per GPU, step time, throughput and MFU of one layout."),
    "plan": ("plan", "Find the fastest layout that fits, with its DeepSpeed config and the reasons."),
    "config": (
        "config",
        "Write the DeepSpeed config (or HF Trainer / Accelerate / Megatron settings) for a layout.",
    ),
    "validate": ("validate", "Check a DeepSpeed config with DeepSpeed's own classes for a world size."),
    "launch": (
        "launch",
        "Check the train command, write the hostfile and run (or print) the deepspeed launcher, or write a "
        "SLURM script.",
    ),
    "calibrate": (
        "calibrate",
        "Measure this machine and write a cluster description for the planner (`--cluster local`).",
    ),
    "checkpoint": (
        "checkpoint",
        "List a folder's checkpoints, or convert one to DeepSpeed's universal format for another world size.",
    ),
    "data": ("data", "Generate a demo corpus, or prepare text files into packed training sequences."),
    "export": ("export", "Write a consolidated HF `save_pretrained` directory from a checkpoint."),
    "grow": (
        "grow",
        "Grow a trained model in depth/width (function-preserving) for `dstk train --init-from`.",
    ),
    "train": ("train", "Train on the ranks a launcher started (what `dstk launch` runs on every rank)."),
    "presets": ("presets", "List model and cluster presets with their key figures."),
    "env": ("env", "Show library versions and the accelerator (stamped into benchmark results)."),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits 2 (instead of usage + message), and takes no
    abbreviated flags: `--gpus 16` would silently become `--gpus-per-node 16`, and an abbreviation that is
    unique today becomes ambiguous (or means something else) when a flag is added."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    other_side: tuple[Any, str] | None = None
    """(a callable giving the flags of the command on the other side of `--`, what to say of one given here):
    `dstk launch` takes dstk train's flags after `--`, and a train flag before it is misplaced, not misspelt."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {self._with_suggestions(message)}\n")

    def _with_suggestions(self, message: str) -> str:
        """argparse's "unrecognized arguments: --stepz 100" with the flag each unknown one was probably meant
        to be, from this parser's own flags (or where it belongs, when it is the other side's of `--`), and
        "invalid choice" of a verb with the nearest verb."""
        import difflib

        choice = re.fullmatch(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            names = re.findall(r"'?([\w-]+)'?", choice[3])
            close = difflib.get_close_matches(choice[2], names, n=1, cutoff=0.6)
            return message + (f"; did you mean {close[0]}?" if close else "")
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return message
        unknown = [w for w in message[len(prefix) :].split() if w.startswith("-")]
        misplaced = self._misplaced(unknown)
        if misplaced:
            return misplaced
        flags = [f for a in self._actions for f in a.option_strings if f.startswith("--")]
        hints = []
        for word in unknown:
            close = difflib.get_close_matches(word.split("=")[0], flags, n=1, cutoff=0.7)
            if close:
                hints.append(f"{word} → {close[0]}?")
        return message + (f" (did you mean: {', '.join(hints)})" if hints else "")

    def _misplaced(self, unknown: list[str]) -> str | None:
        if self.other_side is None:
            return None
        flags, where = self.other_side
        theirs = set(flags())
        found = [w.split("=")[0] for w in unknown if w.split("=")[0] in theirs]
        return f"{', '.join(found)}: {where}" if found else None

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Unknown flags are reported by the parser they were given to (`dstk estimate: error: ...`), not by
        the top-level one, which knows none of a verb's flags."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            verb = self
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction):
                    verb = action.choices.get(getattr(parsed, action.dest, None) or "", self)
            verb.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


# Cluster fields that can be overridden on the command line (the rest: write a cluster file).
CLUSTER_OVERRIDES = (
    "nodes",
    "gpus_per_node",
    "gpu_memory_gib",
    "gpu_peak_tflops",
    "intra_node_gb_per_s",
    "inter_node_gb_per_s",
    "cpu_memory_gib",
    "nvme_gib",
    "gpu_matmul_efficiency",
    "attention_efficiency",
)


def _choices(annotation: Any) -> tuple[type, list[Any] | None]:
    """(python type, Literal choices) of a field annotation such as `Literal[0, 1] | None`."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    inner = args[0]
    if typing.get_origin(inner) is typing.Literal:
        values = list(typing.get_args(inner))
        return type(values[0]), values
    if typing.get_origin(annotation) is typing.Literal:
        values = list(typing.get_args(annotation))
        return type(values[0]), values
    return inner if isinstance(inner, type) else str, None


def _help(text: str | None) -> str | None:
    """A field docstring as argparse help: argparse %-formats help strings, so a literal % must be %%."""
    return None if text is None else text.replace("%", "%%")


def add_model_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    group = parser.add_argument_group("model")
    which = group.add_mutually_exclusive_group(required=required)
    which.add_argument("--model", metavar="M", help="preset name, dstk YAML/JSON file, or HF config.json")
    which.add_argument(
        "--params",
        metavar="N",
        type=_parameter_count,
        help="a GPT-3-shaped model of N parameters, e.g. 175e9 or 7B",
    )
    group.add_argument(
        "--seq-length", type=int, metavar="S", help="override the model's training sequence length"
    )


def _parameter_count(text: str) -> float:
    """`--params` as 175e9, 7B, 1.3T or 350M (the forms `--tokens` takes)."""
    from toolkit.errors import UserError
    from toolkit.plan.training_cost import parse_tokens

    try:
        return parse_tokens(text, "--params")
    except UserError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a parameter count; write e.g. 175e9, 7B or 1.3T"
        ) from None


def add_cluster_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    from toolkit.plan.specs import ClusterSpec

    group = parser.add_argument_group("cluster")
    group.add_argument(
        "--cluster",
        metavar="C",
        required=required,
        help="preset name, cluster YAML/JSON file, or `local` (detected from this machine, calibrated if "
        "`dstk calibrate` ran here)",
    )
    for name in CLUSTER_OVERRIDES:
        field = ClusterSpec.model_fields[name]
        kind, _ = _choices(field.annotation)
        group.add_argument(
            f"--{name.replace('_', '-')}", type=kind, metavar="X", help=_help(field.description)
        )


def add_layout_args(parser: argparse.ArgumentParser) -> None:
    from toolkit.plan.layout import LAYOUT_FLAGS, LayoutRequest

    group = parser.add_argument_group("layout")
    for name, flag in LAYOUT_FLAGS.items():
        field = LayoutRequest.model_fields[name]
        kind, choices = _choices(field.annotation)
        if kind is bool:
            action = argparse.BooleanOptionalAction
            group.add_argument(flag, dest=name, action=action, default=None, help=_help(field.description))
            continue
        group.add_argument(
            flag,
            dest=name,
            type=kind,
            choices=choices,
            metavar=None if choices else ("SPEC" if kind is str else "N"),
            help=_help(field.description),
        )


def field_help(field: Any) -> str | None:
    """A pydantic field's docstring with its default (one that is None is said by the docstring), as argparse
    help (a literal % escaped)."""
    default = "" if field.default is None else f" (default: {field.default})"
    return _help(f"{field.description.rstrip('.')}{default}")


def add_option_fields(
    group: Any,
    model: Any,
    metavars: dict[str, str] | None = None,
    *,
    only: tuple[str, ...] = (),
    unset_is_none: bool = False,
) -> None:
    """One flag per field of a typed option model (`--width-noise` for `width_noise`; `only` some of them): type,
    choices, default and help come from the field, so the flags and the model that checks them cannot drift
    apart. `unset_is_none`: a flag not given is None (the caller lays what was given over a config or the
    model's defaults) and its help says the model's default instead."""
    from pydantic_core import PydanticUndefined

    for name, field in model.model_fields.items():
        if only and name not in only:
            continue
        kind, choices = _choices(field.annotation)
        default = None if field.default is PydanticUndefined else field.default
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=kind,
            choices=choices,
            default=None if unset_is_none else default,
            metavar=None if choices else (metavars or {}).get(name),
            help=field_help(field) if unset_is_none else _help(field.description),
        )


def trace_model(config: dict[str, Any], source: str) -> Any:
    """The loader's tracer (toolkit.plan.load.Tracer): the run half, imported only when a model needs it."""
    from toolkit.run.trace import trace_announced

    return trace_announced(config, source)


def model_from_args(args: argparse.Namespace) -> Any:
    """The model of `--model`/`--params`; what the cost model approximates for a traced one is said once."""
    from toolkit.plan.load import model_from

    model = model_from(args.model, args.params, args.seq_length, tracer=trace_model)
    for note in model.trace.notes if model.trace is not None else ():
        print(f"note: {model.name}: {note}", file=sys.stderr)
    return model


def cluster_from_args(args: argparse.Namespace) -> Any:
    from toolkit.host.local import load_cluster

    cluster = load_cluster(args.cluster, {name: getattr(args, name, None) for name in CLUSTER_OVERRIDES})
    note_local_cluster(args.cluster)
    return cluster


def job_flags(args: argparse.Namespace) -> list[str]:
    """The model and cluster flags as given (`--params` as `--params`, `--seq-length`, every cluster override):
    what a printed "reproduce" command must carry besides the layout to give the same numbers."""
    out = (
        ["--params", repr(args.params)]
        if getattr(args, "params", None) is not None
        else ["--model", args.model]
    )
    if getattr(args, "seq_length", None) is not None:
        out += ["--seq-length", str(args.seq_length)]
    out += ["--cluster", str(args.cluster)]
    for name in CLUSTER_OVERRIDES:
        value = getattr(args, name, None)
        if value is not None:
            out += [f"--{name.replace('_', '-')}", repr(value) if isinstance(value, float) else str(value)]
    return out


def note_local_cluster(ref: str | None) -> None:
    """For `--cluster local`, say on stderr what was detected and whether a calibration was used (stdout
    stays the command's output, e.g. JSON)."""
    from toolkit.plan.load import LOCAL

    if ref != LOCAL:
        return
    from toolkit.host.local import local_cluster_data

    _, summary, warnings = local_cluster_data()
    for line in (summary, *warnings):
        print(line, file=sys.stderr)


def layout_request_from_args(args: argparse.Namespace) -> Any:
    from toolkit.plan.layout import LAYOUT_FLAGS, LayoutRequest
    from toolkit.plan.load import build

    given = {name: getattr(args, name) for name in LAYOUT_FLAGS if getattr(args, name, None) is not None}
    return build(LayoutRequest, given, "layout", labels=LAYOUT_FLAGS)


def add_target_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="deepspeed",
        help="runtime the layout is for: deepspeed (HF models in the DeepSpeed engine: AutoTP architectures only, "
        "data-parallel pipelines), megatron (Megatron-DeepSpeed: any TP/PP) or megatron-core (Megatron-LM's "
        "Megatron-Core: expert folding, interleaved and uneven pipelines, MTP, MXFP8/NVFP4)",
    )


def add_allow_fp8_arg(parser: argparse.ArgumentParser) -> None:
    from toolkit.plan.query import PlanQuery

    parser.add_argument(
        "--allow-fp8", action="store_true", help=_help(PlanQuery.model_fields["allow_fp8"].description)
    )


TARGETS = ("deepspeed", "megatron", "megatron-core")
# Rule scopes (toolkit.plan.rules.Rule.scope) each target runtime must respect: "runs" is what dstk can run or
# configure at all, "core" what only Megatron-Core runs
TARGET_SCOPES = {
    "deepspeed": ("layout", "deepspeed", "runs", "core"),
    "megatron": ("layout", "megatron", "runs", "core"),
    "megatron-core": ("layout", "megatron-core", "runs"),
}


def scopes_from_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The rule scopes of the target runtime `args` name (TARGET_SCOPES)."""
    return TARGET_SCOPES[getattr(args, "target", "deepspeed")]


def print_json(data: Any) -> None:
    import json

    json.dump(data, sys.stdout, sort_keys=True, indent=2)
    sys.stdout.write("\n")
