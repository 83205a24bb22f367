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
    parser.add_argument("--overwrite", action="store_true", help="replace what --out already holds")


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from toolkit.data.tokenizer import check_tokenizer_dir
    from toolkit.launcher.lock import claim_folder
    from toolkit.run.preflight import pick_checkpoint

    model = model_from_args(args)
    # before torch is imported and the weights are consolidated: a typo costs milliseconds
    tag = pick_checkpoint(args.checkpoint, args.tag)
    if args.tokenizer is not None:
        check_tokenizer_dir(args.tokenizer)
    lock = claim_folder(args.out, "--out", args.overwrite, "the model")  # refused if another job holds it
    start = time.time()
    print(f"exporting {args.checkpoint / tag} ({model.name}) …", file=sys.stderr, flush=True)
    from toolkit.run.export import export

    try:
        out = export(model, args.checkpoint, args.out, tag, args.tokenizer)
    finally:
        lock.release()
    print(f"wrote {out} from {args.checkpoint / tag} in {time.time() - start:.1f} s")
    return 0
