"""`dstk data`: `generate` a synthetic demo corpus; `prepare` raw text into packed training sequences."""

from __future__ import annotations

import argparse
from pathlib import Path

from toolkit.commands import OneLineParser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_verb", metavar="ACTION", required=True, parser_class=OneLineParser)
    gen = sub.add_parser("generate", help="write the generated demo corpus (JSONL per domain)")
    gen.add_argument("--out", type=Path, required=True, metavar="DIR")
    gen.add_argument("--docs-per-domain", type=int, default=2000, metavar="N")
    gen.add_argument("--seed", type=int, default=0)
    prep = sub.add_parser("prepare", help="tokenize and pack text files for dstk train")
    prep.add_argument(
        "--input", type=Path, nargs="+", required=True, metavar="PATH", help="JSONL or text files"
    )
    prep.add_argument("--out", type=Path, required=True, metavar="DIR")
    prep.add_argument("--seq-length", type=int, default=128, metavar="N", help="tokens per training sequence")
    which = prep.add_mutually_exclusive_group(required=True)
    which.add_argument("--tokenizer", type=Path, metavar="DIR", help="a local HF tokenizer directory")
    which.add_argument(
        "--train-tokenizer", type=int, metavar="VOCAB", help="train a byte-level BPE of this size"
    )
    prep.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from toolkit.errors import UserError

    if args.data_verb == "generate":
        from toolkit.data.corpus import write_corpus

        if args.docs_per_domain <= 0:
            raise UserError("--docs-per-domain: must be positive")
        for path in write_corpus(args.out, args.docs_per_domain, args.seed):
            print(f"wrote {path}")
        return 0
    from toolkit.data.prepare import prepare

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
        seed=args.seed,
    )
    print(
        f"wrote {args.out}: {manifest['rows']['train']} training and {manifest['rows']['validation']} validation "
        f"sequences of {args.seq_length} tokens, vocabulary {manifest['vocab_size']}"
    )
    return 0
