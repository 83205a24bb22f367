"""The planner's sequence-parallel choice against the run: at a long sequence, `--sp 1` vs `--sp 2` on 2 ranks.

A tiny Llama (h 64, 4 heads, 2 kv heads, 2 blocks) at `--seq-length` tokens (default 16384, where the planner
starts offering Ulysses), fp32, ZeRO-2, micro-batch 1, global batch 2, no recomputation. `dstk plan` on
`--cluster local` (calibrated on this host first, or reused) with those pins picks sp; then both layouts train
a few steps through `dstk config` + `dstk launch` (→ `dstk train`), and each measured step time is printed
beside `dstk estimate`'s. The question the table answers: did the planner pick the layout that ran faster,
and by about the margin it predicted? Writes JSON and Markdown to benchmarks/results/.

Usage: python benchmarks/sp_choice.py [--seq-length N] [--steps N] [--cluster C] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (
    bench_env,
    cluster_for,
    command_line,
    dstk,
    output_paths,
    prepare_data,
    train,
    write_record,
)
from benchmarks.sequence_parallel import MODEL  # the same tiny Llama, at a longer sequence

PINS = ["--zero-stage", "2", "--precision", "fp32", "--micro-batch", "1", "--recompute", "none"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-length", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--cluster", default=None, help="cluster to predict against (default: local, calibrated)")
    ap.add_argument("--out-dir", type=Path, default=None)
    args = ap.parse_args()
    env = bench_env()
    model = {**MODEL, "seq_length": args.seq_length}
    with tempfile.TemporaryDirectory(prefix="dstk-sp-choice-") as d:
        tmp = Path(d)
        model_file = tmp / "model.yaml"
        model_file.write_text(yaml.safe_dump(model))
        cluster = cluster_for(tmp, args.cluster, env)
        job = ["--model", str(model_file), "--cluster", cluster, "--nodes", "1", "--gpus-per-node", "2"]
        chosen = json.loads(dstk("plan", *job, *PINS, "--global-batch", "2", "--json", env=env).stdout)
        predicted = {}
        for sp in (1, 2):
            est = dstk("estimate", *job, *PINS, "--global-batch", "2", "--sp", str(sp), "--json", env=env)
            predicted[sp] = json.loads(est.stdout)["step_time_s"]
        data = prepare_data(tmp, model, 2000)
        measured = {}
        for sp in (1, 2):
            layout = [*PINS, "--global-batch", "2", "--sp", str(sp)]
            summary = train(tmp / f"sp{sp}", model_file, cluster, data, args.steps, layout, env)
            measured[sp] = summary["step_time_s"]
    pick = chosen["layout"]["sp"]
    faster = min(measured, key=measured.get)
    record = {
        "command": command_line(),
        "model": model,
        "cluster": cluster,
        "planner_sp": pick,
        "planner_explanation": chosen["explanation"],
        "predicted_step_s": predicted,
        "measured_step_s": measured,
        "measured_faster_sp": faster,
        "predicted_ratio_sp2_over_sp1": predicted[2] / predicted[1],
        "measured_ratio_sp2_over_sp1": measured[2] / measured[1],
    }
    paths = output_paths("sp_choice", args.out_dir)
    write_record(paths["json"], record)
    lines = [
        f"# The planner's sequence-parallel choice at {args.seq_length} tokens, 2 ranks ({cluster})",
        "",
        f"Command: `{record['command']}`",
        "",
        "| sp | step s predicted | step s measured | measured / predicted |",
        "|---|---|---|---|",
        *[
            f"| {sp} | {predicted[sp]:.3f} | {measured[sp]:.3f} | {measured[sp] / predicted[sp]:.2f} |"
            for sp in (1, 2)
        ],
        "",
        f"Planner's pick: sp={pick}; measured faster: sp={faster}. sp=2 / sp=1 step time: predicted "
        f"{record['predicted_ratio_sp2_over_sp1']:.3f}, measured {record['measured_ratio_sp2_over_sp1']:.3f}.",
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
