"""`dstk checkpoint convert`: turn a complete checkpoint into DeepSpeed's universal format, so a run can resume
on a different number of ranks (`dstk train --checkpoint-dir OUT --resume auto` with a config for the new
world size; dstk switches `checkpoint.load_universal` on by itself)."""

from __future__ import annotations

import argparse
from pathlib import Path

from toolkit.commands import OneLineParser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(
        dest="checkpoint_verb", metavar="ACTION", required=True, parser_class=OneLineParser
    )
    conv = sub.add_parser(
        "convert", help="DeepSpeed universal checkpoint, for resuming on another world size"
    )
    conv.add_argument(
        "--checkpoint", type=Path, required=True, metavar="DIR", help="dstk train --checkpoint-dir"
    )
    conv.add_argument("--tag", metavar="TAG", help="checkpoint to convert (default: the newest complete one)")
    conv.add_argument("--out", type=Path, required=True, metavar="DIR", help="new checkpoint directory")


def run(args: argparse.Namespace) -> int:
    from toolkit.run.universal import convert

    tag_dir = convert(args.checkpoint, args.out, args.tag)
    print(
        f"wrote {tag_dir} (universal); resume with: dstk train ... --checkpoint-dir {args.out} --resume auto"
    )
    return 0
