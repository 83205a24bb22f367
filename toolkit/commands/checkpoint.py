"""`dstk checkpoint ls`: the checkpoints of a directory and its shared-memory snapshots (toolkit.run.tiers) —
tier, step, complete or why not, size — newest first, the one `--resume auto` loads marked.

`dstk checkpoint convert`: turn a complete checkpoint into DeepSpeed's universal format, so a run can resume
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
    conv.add_argument(
        "--overwrite", action="store_true", help="replace a checkpoint of the same tag already in --out"
    )
    ls = sub.add_parser("ls", help="checkpoints and shared-memory snapshots: tier, step, completeness, size")
    ls.add_argument(
        "--checkpoint", type=Path, required=True, metavar="DIR", help="dstk train --checkpoint-dir"
    )


def run(args: argparse.Namespace) -> int:
    if args.checkpoint_verb == "ls":
        return _ls(args.checkpoint)
    import sys
    import time

    from toolkit.errors import UserError
    from toolkit.launcher.lock import check_folder, lock_folder
    from toolkit.paths import output_dir
    from toolkit.run.preflight import pick_checkpoint

    tag = pick_checkpoint(args.checkpoint, args.tag)
    output_dir(args.out, "--out")
    if args.out.resolve() == args.checkpoint.resolve():
        raise UserError("--out: must differ from --checkpoint")
    check_folder(args.out, "--out")  # a job training into it is named first
    if (args.out / tag).exists() and not args.overwrite:
        raise UserError(f"--out: {args.out / tag} exists; give another folder, or --overwrite to replace it")
    start = time.time()
    print(f"converting {args.checkpoint / tag} …", file=sys.stderr, flush=True)
    from toolkit.run.universal import convert

    lock = lock_folder(args.out, "--out")
    try:
        tag_dir = convert(args.checkpoint, args.out, tag)
    finally:
        lock.release()
    print(
        f"wrote {tag_dir} (universal) in {time.time() - start:.1f} s; resume with: dstk train ... "
        f"--checkpoint-dir {args.out} --resume auto"
    )
    return 0


def _ls(ckpt_dir: Path) -> int:
    """One line per checkpoint directory of both tiers (sizes and manifests only: no hashing, no torch)."""
    import json

    from toolkit.errors import UserError
    from toolkit.plan.units import format_bytes
    from toolkit.run.checkpoint import MANIFEST, check, memory_tier, newest_complete

    if (ckpt_dir / MANIFEST).is_file():
        raise UserError(
            f"--checkpoint: {ckpt_dir} is one checkpoint, not a folder of them; give --checkpoint {ckpt_dir.parent}"
        )
    tiers = [("disk", ckpt_dir), ("memory", memory_tier(ckpt_dir))]
    if not ckpt_dir.is_dir() and not tiers[1][1].is_dir():
        raise UserError(f"--checkpoint: {ckpt_dir} is not a directory")
    newest = newest_complete(ckpt_dir, verify_hashes=False)
    loads = newest[0][0] / newest[0][1] if newest else None
    rows = []
    for tier, where in tiers:
        if not where.is_dir():
            continue
        for tag_dir in sorted(p for p in where.iterdir() if p.is_dir() and p.name.startswith("step")):
            problem = check(tag_dir, verify_hashes=False)
            size = sum(p.stat().st_size for p in tag_dir.rglob("*") if p.is_file())
            universal = not problem and json.loads((tag_dir / MANIFEST).read_text()).get("universal")
            flags = " (universal)" if universal else ""
            state = f"incomplete: {problem}" if problem else f"complete{flags}"
            mark = "  <- --resume auto" if tag_dir == loads else ""
            rows.append(
                (tag_dir.name, tier, f"{tier:<6}  {tag_dir}  {format_bytes(size, 1):>12}  {state}{mark}")
            )
    if not rows:
        print(f"no checkpoints in {ckpt_dir} (nor shared-memory snapshots of it)")
        return 0
    for _, _, line in sorted(rows, reverse=True):
        print(line)
    return 0
