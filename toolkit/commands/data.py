"""`dstk data`: `generate` a synthetic demo corpus; `prepare` raw text into packed (or, with --no-pack,
per-document) training sequences.

The threshold flags of `prepare` are derived from the pydantic fields they set (name, type, choices, help,
default), so the help text and the pipeline's defaults cannot drift apart.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from toolkit.commands import OneLineParser, _choices, _help, add_option_fields, field_help

SOURCE = "data prepare"
ACTIONS = {
    "generate": "write the generated demo corpus (JSONL per domain)",
    "prepare": "clean, filter, deduplicate, mix, tokenize and pack text files",
}
"""`dstk data ACTION`: the help of each action, and what `dstk data` alone lists."""


def _option_models() -> tuple[Any, ...]:
    from toolkit.data.options import DedupOptions, QualityFilter

    return QualityFilter, DedupOptions


METAVARS = {"slurm_partition": "P", "slurm_time": "D-H:M:S", "slurm_mem_per_cpu": "MEM", "slurm_qos": "Q"}
READING = ("text_field", "domain_field")


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _add_model_flags(group: Any, model: Any, only: tuple[str, ...] = ()) -> None:
    """The option model's fields as flags that are None unless given (toolkit.commands.add_option_fields)."""
    metavars = {
        n: METAVARS.get(n, "N" if _choices(f.annotation)[0] is int else "X")
        for n, f in model.model_fields.items()
    }
    add_option_fields(group, model, metavars, only=only, unset_is_none=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # not required=True: argparse would say only "required: ACTION"; run() lists the actions instead
    sub = parser.add_subparsers(dest="data_verb", metavar="ACTION", parser_class=OneLineParser)
    _add_generate(sub)
    prep = _add_prepare(sub)
    _add_prepare_stages(prep)


def _add_generate(sub: Any) -> None:
    gen = sub.add_parser("generate", help=ACTIONS["generate"], description=ACTIONS["generate"])
    gen.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory for web.jsonl, code.jsonl, books.jsonl",
    )
    gen.add_argument(
        "--docs-per-domain", type=int, default=2000, metavar="N", help="documents per domain (default: 2000)"
    )
    gen.add_argument("--seed", type=int, default=0, help="generator seed (default: 0)")
    gen.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a --out that already holds files (web.jsonl, code.jsonl and books.jsonl are replaced)",
    )


def _add_prepare(sub: Any) -> argparse.ArgumentParser:
    """`dstk data prepare`'s inputs, outputs, tokenizer and reading flags."""
    from toolkit.data.options import PrepareOptions

    prep = sub.add_parser("prepare", help=ACTIONS["prepare"], description=ACTIONS["prepare"])
    prep.add_argument(
        "--input",
        type=Path,
        nargs="+",
        required=True,
        metavar="PATH",
        help="JSONL (.jsonl, .jsonl.gz, .jsonl.zst), text (a document per line, compressed or not), Parquet "
        "files, HF datasets folders (save_to_disk), directories or quoted globs of them; the domain is a "
        "record's --domain-field, else the file stem",
    )
    prep.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="output directory (train/, validation/, megatron/, tokenizer/, manifest.json); not inside an "
        "--input directory",
    )
    prep.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the prepared dataset already in --out (the old one stays until the new one is complete)",
    )
    _add_rows(prep)
    _add_tokenizer_and_split(prep)
    fields = PrepareOptions.model_fields
    _add_model_flags(prep, PrepareOptions, only=(*READING, "format"))
    prep.add_argument("--max-shard-mb", type=int, metavar="MB", help=field_help(fields["max_shard_mb"]))
    prep.add_argument(
        "--tokenizer-sample-mb", type=float, metavar="MB", help=field_help(fields["tokenizer_sample_mb"])
    )
    return prep


def _add_rows(prep: argparse.ArgumentParser) -> None:
    """What a training row is: --seq-length tokens, packed or one document per row."""
    prep.add_argument("--seq-length", type=int, default=128, metavar="N", help="tokens per training sequence")
    prep.add_argument(
        "--no-pack",
        dest="packing",
        action="store_const",
        const="none",
        help="a row per document (cut into --seq-length pieces when longer) instead of packed rows, "
        "for dstk train --token-budget",
    )


def _add_tokenizer_and_split(prep: argparse.ArgumentParser) -> None:
    """The tokenizer (given or trained), the seed and the held-out share."""
    which = prep.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--tokenizer",
        type=Path,
        metavar="DIR",
        help="a local HF tokenizer directory holding tokenizer.json (e.g. another dataset's DIR/tokenizer); "
        "never looked up on the Hub",
    )
    which.add_argument(
        "--train-tokenizer",
        type=int,
        metavar="VOCAB",
        help="train a byte-level BPE of this size on the kept text",
    )
    prep.add_argument("--seed", type=int, default=0, help="mixing and shuffling seed (default: 0)")
    prep.add_argument(
        "--validation-fraction",
        type=float,
        default=0.02,
        metavar="F",
        help="share of documents held out, chosen by a hash of their text (default: 0.02)",
    )


def _add_prepare_stages(prep: argparse.ArgumentParser) -> None:
    """The flags of the stages: cleaning and filters, deduplication, the domain mixture, the executors."""
    from toolkit.data.options import ExecutionOptions, PrepareOptions

    fields = PrepareOptions.model_fields
    clean = prep.add_argument_group("cleaning and filters")
    clean.add_argument(
        "--boilerplate",
        type=Path,
        metavar="FILE",
        help="regexes, one per line, replacing the default boilerplate rules (cookie policy, all rights reserved, ...)",
    )
    clean.add_argument(
        "--languages", metavar="LIST", help=_help(f"e.g. en,de. {fields['languages'].description}")
    )
    quality, dedup = _option_models()
    _add_model_flags(clean, quality)
    _add_model_flags(prep.add_argument_group("deduplication"), dedup)
    mix = prep.add_argument_group("domain mixture")
    mix.add_argument(
        "--mix",
        metavar="SPEC",
        help="target token share per domain, e.g. web=0.6,code=0.3,books=0.1 (normalised; larger domains are cut)",
    )
    mix.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="without --mix: weights ∝ tokens^(1/T) (XLM/mT5 temperature sampling; default: 1, natural shares)",
    )
    _add_model_flags(prep.add_argument_group("processes and nodes (datatrove executors)"), ExecutionOptions)


def prepare_options(args: argparse.Namespace) -> Any:
    """The PrepareOptions the flags ask for; bad values become one UserError line naming the flag."""
    from toolkit.data.clean import DEFAULT_BOILERPLATE, load_boilerplate
    from toolkit.data.mix import parse_mix
    from toolkit.data.options import PrepareOptions
    from toolkit.errors import UserError
    from toolkit.plan.load import build

    sub = {}
    for model in _option_models():
        given = {n: getattr(args, n) for n in model.model_fields if getattr(args, n, None) is not None}
        sub[model] = build(model, given, SOURCE, labels={n: _flag(n) for n in model.model_fields})
    quality, dedup = (sub[m] for m in _option_models())
    if args.mix is not None and args.temperature is not None:
        raise UserError("--mix/--temperature: give one (explicit weights, or temperature sampling)")
    languages = None
    if args.languages is not None:
        languages = tuple(t.strip().lower() for t in args.languages.split(",") if t.strip())
        if not languages:
            raise UserError(f"--languages: {args.languages!r} names no language (e.g. --languages en,de)")
    given = {
        "quality": quality,
        "dedup": dedup,
        "boilerplate": load_boilerplate(args.boilerplate) if args.boilerplate else DEFAULT_BOILERPLATE,
        "languages": languages,
        "mix": parse_mix(args.mix) if args.mix is not None else None,
        "temperature": args.temperature,
        "max_shard_mb": args.max_shard_mb,
        "tokenizer_sample_mb": args.tokenizer_sample_mb,
        "packing": getattr(args, "packing", None),
        **{n: getattr(args, n, None) for n in (*READING, "format")},
    }
    labels = {n: _flag(n) for n in ("temperature", "max_shard_mb", "tokenizer_sample_mb", *READING, "format")}
    return build(PrepareOptions, {k: v for k, v in given.items() if v is not None}, SOURCE, labels=labels)


def execution_options(args: argparse.Namespace) -> Any:
    """The ExecutionOptions the flags ask for; SLURM flags only with --executor slurm."""
    from toolkit.data.options import ExecutionOptions
    from toolkit.errors import UserError
    from toolkit.plan.load import build

    fields = ExecutionOptions.model_fields
    given = {n: getattr(args, n) for n in fields if getattr(args, n, None) is not None}
    if given.get("executor", "local") != "slurm":
        for name in (n for n in given if n.startswith("slurm_")):
            raise UserError(f"{_flag(name)}: only with --executor slurm")
    return build(ExecutionOptions, given, SOURCE, labels={n: _flag(n) for n in fields})


def run(args: argparse.Namespace) -> int:
    from toolkit.errors import UserError

    if args.data_verb is None:
        actions = "; ".join(f"{name}: {what}" for name, what in ACTIONS.items())
        raise UserError(f"ACTION: give one ({actions}); dstk data ACTION --help for its flags")
    if args.data_verb == "generate":
        return _generate(args)
    from toolkit.data.prepare import prepare
    from toolkit.data.progress import Console

    if args.seq_length <= 1:
        raise UserError(f"--seq-length: {args.seq_length} must be at least 2")
    if args.train_tokenizer is not None and not 256 < args.train_tokenizer <= 1_000_000:
        raise UserError(f"--train-tokenizer: vocabulary {args.train_tokenizer} must be in 257 .. 1,000,000")
    manifest = prepare(
        args.input,
        args.out,
        args.seq_length,
        tokenizer=args.tokenizer,
        vocab_size=args.train_tokenizer,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        options=prepare_options(args),
        overwrite=args.overwrite,
        progress=Console(),
        execution=execution_options(args),
    )
    print(_summary(args, manifest))
    return 0


def _summary(args: argparse.Namespace, manifest: dict[str, Any]) -> str:
    """The one line a finished `data prepare` prints: what it wrote and what it dropped."""
    dropped = ", ".join(f"{n} {reason}" for reason, n in manifest["dropped"].items() if n) or "none"
    kept = sum(manifest["documents"].values())
    size = (
        f"of {args.seq_length} tokens"
        if manifest["packing"] == "concat"
        else f"of up to {args.seq_length} tokens"
    )
    bad = sum(manifest["bad_input"].values())
    unusable = f"; {bad} unusable input lines or files (manifest.json bad_input_files)" if bad else ""
    rows = manifest["rows"]
    wrote = [f"{rows['train']} training and {rows['validation']} validation sequences {size}"] if rows else []
    if "megatron" in manifest:
        docs = manifest["megatron"]["documents"]
        wrote.append(
            f"Megatron files of {docs['train']} training and {docs['validation']} validation documents"
        )
    return (
        f"wrote {args.out}: {' and '.join(wrote)}, vocabulary {manifest['vocab_size']}; "
        f"{kept} of {manifest['stages'][0]['in']} documents kept (dropped: {dropped}){unusable}"
    )


def _generate(args: argparse.Namespace) -> int:
    from toolkit.data.corpus import write_corpus
    from toolkit.errors import UserError
    from toolkit.launcher.lock import claim_folder

    if args.docs_per_domain <= 0:
        raise UserError("--docs-per-domain: must be positive")
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out: {args.out} is a file; expected a directory")
    lock = claim_folder(args.out, "--out", args.overwrite, "the corpus")
    try:
        for path in write_corpus(args.out, args.docs_per_domain, args.seed):
            print(f"wrote {path}")
    finally:
        lock.release()
    return 0
