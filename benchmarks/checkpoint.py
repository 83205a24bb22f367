"""Checkpoints that do not stop training: synchronous vs asynchronous saves vs shared-memory snapshots.

One run per (ZeRO stage, mode) of a 124M-parameter GPT-2 (GPT-2 small's shape at a 256-token context) through
`dstk launch` → `dstk train` on 2 ranks, fp32, saving every `--every` steps:
- `sync`: `--no-async-save`: the training thread writes, fsyncs and hashes every file before the next step;
- `async`: `--async-save`: the state is copied to host memory and persisted by a writer thread per rank;
- `memory`: `--async-save --snapshot-every K`: the saves go to /dev/shm (one disk checkpoint at the end),
  pipelined: no copy on the training thread, the writer reads the live state before the next optimizer step.
Per row, from each run's `summary.json` (`checkpoints`): the stall each save put on the training thread
(median of the saves after the first, which also allocates the reused host buffers; the first beside it), the time until it was durable (sync: the stall; otherwise the background persist), the time saves
waited for the previous one, and — for a kill at a uniformly random point — the expected steps redone: half
an interval plus the steps during which the newest save was not yet durable. Beside them what
`toolkit.plan.checkpoint_interval` predicts for the same model on the cluster (`--cluster`, default `local`):
the stall (the copy to host memory; for the pipelined snapshot the part of it the step does not hide, all of
it on the CPU accelerator, where the writer takes the ranks' cores: there the cost shows in the step time
rather than the stall) and the write. Writes CSV, JSON, Markdown and a PNG to benchmarks/results/.

Usage: python benchmarks/checkpoint.py [--quick] [--cluster C] [--steps N] [--every K] [--out-dir DIR]
       (--quick: the 1M-parameter test model, a smoke run)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (
    TINY_GPT2,
    bench_env,
    command_line,
    output_paths,
    prepare_data,
    train,
    write_csv,
    write_record,
)

MODEL = {
    "name": "gpt2-124m",
    "architecture": "gpt2",
    "n_layers": 12,
    "hidden_size": 768,
    "n_heads": 12,
    "vocab_size": 50257,
    "seq_length": 256,
    "max_position_embeddings": 1024,
    "dropout": False,
}
MODES = {
    "sync": ["--no-async-save"],
    "async": ["--async-save"],
    "memory": ["--async-save", "--snapshot-every", "{every}"],
}
COLUMNS = [
    "stage",
    "mode",
    "saves",
    "first_stall_s",
    "stall_s",
    "durable_s",
    "wait_s",
    "step_time_s",
    "stall_over_sync",
    "expected_lost_steps",
    "predicted_stall_s",
    "predicted_write_s",
    "checkpoint_bytes",
    "final_loss",
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cluster", default="local", help="cluster the prediction is for (default: local)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 7; --quick 5)")
    parser.add_argument("--every", type=int, default=2, help="save every K steps (default 2)")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="where to write (default benchmarks/results)"
    )
    args = parser.parse_args()
    import yaml

    from toolkit.host.local import load_cluster
    from toolkit.plan.checkpoint_interval import checkpoint_plan
    from toolkit.plan.layout import Layout
    from toolkit.plan.load import load_model

    model = TINY_GPT2 if args.quick else MODEL
    steps = args.steps or (5 if args.quick else 7)
    env = bench_env()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        model_file = t / "model.yaml"
        model_file.write_text(yaml.safe_dump(model))
        data = prepare_data(t, model, 200)
        spec, cluster = load_model(str(model_file)), load_cluster(args.cluster, {"gpus_per_node": 2})
        for stage in (1, 3):
            layout = [
                "--zero-stage",
                str(stage),
                "--precision",
                "fp32",
                "--micro-batch",
                "1",
                "--global-batch",
                "2",
            ]
            layout += ["--recompute", "none", "--lr", "1e-4", "--warmup-steps", "1"]
            for mode, extra in MODES.items():
                run = t / f"z{stage}-{mode}"
                ckpt = ["--checkpoint-dir", str(run / "ckpt"), "--keep-last", "1"]
                every = ["--save-every", str(steps if mode == "memory" else args.every)]
                flags = [f.format(every=args.every) for f in extra]
                s = train(
                    run,
                    model_file,
                    args.cluster,
                    data,
                    steps,
                    layout,
                    env,
                    train_extra=(*ckpt, *every, *flags),
                )
                rows.append(_row(stage, mode, s, args.every))
                print(
                    f"ZeRO-{stage} {mode:>6}: stall {rows[-1]['stall_s']:.3f} s, durable after "
                    f"{rows[-1]['durable_s']:.3f} s, step {rows[-1]['step_time_s']:.3f} s",
                    flush=True,
                )
            planned = checkpoint_plan(spec, cluster, Layout(**_layout_of(run)), rows[-1]["step_time_s"])
            for r in rows[-len(MODES) :]:
                sync = next(x for x in rows if x["stage"] == stage and x["mode"] == "sync")
                r["stall_over_sync"] = r["stall_s"] / sync["stall_s"]
                r["predicted_stall_s"] = {
                    "sync": planned.write_s,
                    "async": planned.snapshot_s,
                    "memory": planned.memory_snapshot_s,
                }[r["mode"]]
                r["predicted_write_s"] = planned.write_s
                r["checkpoint_bytes"] = planned.bytes
    _write(rows, model, args, steps)
    return 0


def _layout_of(run: Path) -> dict[str, Any]:
    import json

    return json.loads((run / "ds_config.json").read_text())["dstk"]["layout"]


def _row(stage: int, mode: str, s: dict[str, Any], every: int) -> dict[str, Any]:
    tier = s["checkpoints"]["memory" if mode == "memory" else "disk"]
    # steady state: the first save of a tier also allocates the host buffers the later ones reuse
    stalls = tier["stall_s"][1:] or tier["stall_s"]
    durable = stalls if mode == "sync" else tier["persist_s"]
    step = s["step_time_s"]
    lag_steps = statistics.median(durable) / step if mode != "sync" else 0.0
    return {
        "stage": stage,
        "mode": mode,
        "saves": len(tier["stall_s"]),
        "first_stall_s": tier["stall_s"][0],
        "stall_s": statistics.median(stalls),
        "durable_s": statistics.median(durable),
        "wait_s": sum(tier["wait_s"]),
        "step_time_s": step,
        "expected_lost_steps": every / 2 + lag_steps,
        "final_loss": s["losses"][-1],
    }


def _write(rows: list[dict[str, Any]], model: dict[str, Any], args: argparse.Namespace, steps: int) -> None:
    tag = "checkpoint_quick" if args.quick else "checkpoint"
    paths = output_paths(tag, args.out_dir)
    write_csv(paths["csv"], rows, COLUMNS)
    write_record(paths["json"], {"rows": rows, "model": model, "steps": steps, "every": args.every})
    lines = [
        f"# Checkpoint stall: synchronous vs asynchronous vs shared-memory ({model['name']}, 2 ranks, fp32)",
        "",
        f"Command: `{command_line()}`",
        "",
        "| ZeRO | mode | saves | first stall s | stall s | durable after s | waited s | step s | stall / sync | "
        "lost steps (random kill) | predicted stall s | predicted write s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['stage']} | {r['mode']} | {r['saves']} | {r['first_stall_s']:.3f} | {r['stall_s']:.3f} | "
            f"{r['durable_s']:.3f} | "
            f"{r['wait_s']:.2f} | {r['step_time_s']:.3f} | {r['stall_over_sync']:.3f} | "
            f"{r['expected_lost_steps']:.2f} | {r['predicted_stall_s']:.3f} | {r['predicted_write_s']:.3f} |"
        )
    lines += [
        "",
        "Stall: seconds a save held the training thread (median of the saves after the first, which also "
        "allocates the tier's reused host buffers: its stall is the first column). Durable after: until every file was fsynced "
        "(sync: the stall itself). Lost steps: expected steps redone after a kill at a uniformly random point "
        f"with saves every {args.every} steps — half an interval plus the steps the newest save was not yet "
        "durable. Predicted: toolkit.plan.checkpoint_interval for this model on the cluster "
        f"`{args.cluster}` (stall: the copy to host memory; sync stall: the write; memory: the copy the step "
        "does not hide — all of it on the CPU accelerator, where the pipelined writer takes the ranks' cores, so "
        "its cost shows in the step time rather than in the stall).",
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    _plot(rows, paths["png"])
    print(f"wrote {paths['csv']}, {paths['md']}, {paths['png']}")


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"Z{r['stage']}\n{r['mode']}" for r in rows]
    x = range(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    axes[0].bar([i - 0.2 for i in x], [r["stall_s"] for r in rows], 0.4, label="measured stall")
    axes[0].bar([i + 0.2 for i in x], [r["predicted_stall_s"] for r in rows], 0.4, label="predicted")
    axes[0].set_yscale("log")
    axes[0].set_title("training stall per save (s)")
    axes[1].bar(list(x), [r["expected_lost_steps"] for r in rows])
    axes[1].set_title("expected steps redone after a random kill")
    for ax in axes:
        ax.set_xticks(list(x), labels, fontsize=8)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
