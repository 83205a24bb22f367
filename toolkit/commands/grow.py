"""`dstk grow`: grow a trained model in depth and/or width (toolkit.run.grow), print the re-plan for the grown model
(toolkit.plan.progressive.replan), or run a train → grow → train schedule (toolkit.plan.progressive.run_schedule)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from toolkit.commands import add_cluster_args, add_layout_args, add_option_fields


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Cluster and layout flags constrain the re-plan printed after growing, as in dstk plan "
        "(default cluster: cpu; the global batch stays the parent's plan's unless given)."
    )
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="CKPT",
        help="a dstk train --checkpoint-dir (newest complete checkpoint, or --tag) or a save_pretrained directory",
    )
    parser.add_argument(
        "--to", metavar="M", help="the grown model's description (preset, YAML/JSON, config.json)"
    )
    parser.add_argument(
        "-o", "--out", type=Path, metavar="DIR", help="write the grown save_pretrained directory here"
    )
    parser.add_argument(
        "--from-model",
        metavar="M",
        help="the checkpoint's model description (default: inferred from its weights' shapes and --to)",
    )
    parser.add_argument("--tag", metavar="TAG", help="checkpoint to grow (default: the newest complete one)")
    from toolkit.plan.growth_map import GrowthOptions

    add_option_fields(parser, GrowthOptions, {"width_noise": "F"})
    _add_check_arguments(parser)
    _add_schedule_arguments(parser)
    add_cluster_args(parser, required=False)
    add_layout_args(parser)


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """The check that the grown model computes the parent's function, and the tokenizer copied beside it."""
    parser.add_argument(
        "--data", type=Path, metavar="DIR", help="check parent vs grown loss on this dstk data prepare output's "
        "validation split (default: random tokens)"
    )  # fmt: skip
    parser.add_argument(
        "--eval-rows", type=int, default=64, metavar="N", help="validation rows to check on (64)"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        metavar="DIR",
        help="copy this tokenizer next to the weights (default: --from's)",
    )


def _add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    """A whole train → grow → train schedule instead of one growth."""
    parser.add_argument(
        "--schedule",
        type=Path,
        metavar="FILE",
        help="run a train → grow → train schedule (YAML/JSON) instead of one growth",
    )
    parser.add_argument("--dry-run", action="store_true", help="with --schedule: print the commands only")


def run(args: argparse.Namespace) -> int:
    from toolkit.errors import UserError

    if args.schedule is not None:
        given = [
            flag for flag, value in (("--from", args.source), ("--to", args.to), ("--out", args.out)) if value
        ]
        if given:
            raise UserError(
                f"--schedule: the schedule names the models and directories; drop {', '.join(given)}"
            )
        from toolkit.plan.progressive import load_schedule, run_schedule

        run_schedule(load_schedule(args.schedule), dry_run=args.dry_run)
        return 0
    missing = [
        flag for flag, value in (("--from", args.source), ("--to", args.to), ("--out", args.out)) if not value
    ]
    if missing:
        raise UserError(f"{missing[0]}: required (or give --schedule FILE)")
    if args.dry_run:
        raise UserError("--dry-run: only with --schedule")
    return _grow(args)


def _checked(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(target, --from-model, cluster, query), every input checked before any weights are read: a typo
    costs milliseconds, not a half-written --out."""
    from toolkit.commands import cluster_from_args, layout_request_from_args
    from toolkit.errors import UserError
    from toolkit.launcher.lock import LOCK_NAME, check_folder
    from toolkit.paths import input_dir, output_dir
    from toolkit.plan.load import load_model
    from toolkit.plan.query import PlanQuery

    if args.tokenizer is not None:
        from toolkit.data.tokenizer import check_tokenizer_dir

        check_tokenizer_dir(args.tokenizer)
    target = load_model(args.to)
    from_model = load_model(args.from_model) if args.from_model else None
    args.cluster = args.cluster or "cpu"
    cluster = cluster_from_args(args)
    query = PlanQuery.pinning(layout_request_from_args(args))
    check_folder(args.out, "--out")  # another job's, named first
    output_dir(args.out, "--out")
    if args.out.exists() and any(p.name != LOCK_NAME for p in args.out.iterdir()):
        raise UserError(f"--out: {args.out} already holds files; give an empty or new folder")
    if args.data is not None:
        input_dir(args.data, "--data", "the folder dstk data prepare wrote")
    return target, from_model, cluster, query


def _grow(args: argparse.Namespace) -> int:
    from toolkit.commands import CLUSTER_OVERRIDES
    from toolkit.launcher.lock import lock_folder
    from toolkit.plan.progressive import replan
    from toolkit.run.grow import grow

    target, from_model, cluster, query = _checked(args)
    created = not args.out.exists()
    lock = lock_folder(args.out, "--out")  # this job's until the weights are written
    try:
        result = grow(
            args.source, target, args.out, from_model=from_model, tag=args.tag, depth_method=args.depth_method,
            new_blocks=args.new_blocks, width_noise=args.width_noise, seed=args.seed, data=args.data,
            eval_rows=args.eval_rows, tokenizer=args.tokenizer,
        )  # fmt: skip
    finally:
        lock.release()
        if created and not any(args.out.iterdir()):  # refused inside grow: leave nothing behind
            args.out.rmdir()
    _say(result, args)
    query = _at_the_trained_batch(query, Path(result.source))
    overrides = [
        f"--{name.replace('_', '-')} {getattr(args, name)}"
        for name in CLUSTER_OVERRIDES
        if getattr(args, name, None) is not None
    ]
    cluster_ref = " ".join([args.cluster, *overrides])
    g = result.growth
    for line in replan(g.parent, g.target, cluster, query, grown_ref=args.to, cluster_ref=cluster_ref):
        print(line)
    return 0


def _say(result: Any, args: argparse.Namespace) -> None:
    """What was grown, the check that the function is preserved, and the next command."""
    g, c = result.growth, result.check
    p, t = g.parent, g.target
    print(
        f"grew {result.source}: {p.n_layers} layers × h={p.hidden_size} → {t.n_layers} layers × h={t.hidden_size}"
        f" ({result.n_params[0]:,} → {result.n_params[1]:,} parameters)"
    )
    print(f"  {g.describe()}")
    kept = "function preserved" if g.function_preserving else "function changed (copy)"
    print(
        f"  check on {c['on']}: parent loss {c['parent_loss']:.6f}, grown {c['grown_loss']:.6f}, "
        f"|Δ| {c['abs_diff']:.2e}, max |Δ logit| {c['max_logit_diff']:.2e} ({kept})"
    )
    print(f"wrote {args.out} (continue with: dstk train --model {args.to} --init-from {args.out} ...)")


def _at_the_trained_batch(query: Any, source: Path) -> Any:
    """Re-plan at the global batch the parent trained with (its checkpoint manifest records it) unless
    --global-batch says otherwise: a progressive run keeps its batch, the size table's default would not."""
    import json

    from toolkit.run.checkpoint import MANIFEST

    manifest = source / MANIFEST
    if query.global_batch_size is not None or not manifest.is_file():
        return query
    trained = (json.loads(manifest.read_text()).get("layout") or {}).get("global_batch_size")
    return query.model_copy(update={"global_batch_size": trained}) if trained else query
