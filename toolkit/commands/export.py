"""`dstk export`: a complete checkpoint → an HF `save_pretrained` directory (fp32, consolidated)."""

from __future__ import annotations

import argparse
from pathlib import Path

from toolkit.commands import add_model_args, model_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument(
        "--checkpoint", type=Path, required=True, metavar="DIR", help="dstk train --checkpoint-dir"
    )
    parser.add_argument(
        "--tag", metavar="TAG", help="checkpoint to export (default: the newest complete one)"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        metavar="DIR",
        help="save this local tokenizer directory (e.g. DATA/tokenizer) next to the weights",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")


def run(args: argparse.Namespace) -> int:
    from toolkit.data.tokenizer import check_tokenizer_dir

    if args.tokenizer is not None:  # before the weights are consolidated: a typo costs milliseconds
        check_tokenizer_dir(args.tokenizer)
    from toolkit.run.export import export

    out = export(model_from_args(args), args.checkpoint, args.out, args.tag, args.tokenizer)
    print(f"wrote {out}")
    return 0
