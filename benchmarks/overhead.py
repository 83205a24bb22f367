"""What `dstk train` costs over a minimal hand-written `deepspeed.initialize` loop (goal: step-time ratio ≤ 1.02).

Same model, config and data on 2 CPU ranks; the two are run interleaved (A B A B ...) so machine noise hits
both, and the ratio of median step times (first 2 steps of each run excluded) is reported.
Usage: python benchmarks/overhead.py [--pairs 3] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import result_path, write_json

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny-gpt2"


def _dstk(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "toolkit.cli", *args], check=True, cwd=REPO, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        _dstk("data", "generate", "--out", str(t / "raw"))
        _dstk(
            "data",
            "prepare",
            "--input",
            *map(str, sorted((t / "raw").glob("*.jsonl"))),
            "--out",
            str(t / "data"),
            "--seq-length",
            "128",
            "--train-tokenizer",
            "2048",
        )
        cfg = t / "ds.json"
        _dstk(
            "config",
            "--model",
            MODEL,
            "--cluster",
            "cpu",
            "--zero-stage",
            "2",
            "--micro-batch",
            "8",
            "--global-batch",
            "16",
            "--train-steps",
            str(args.steps),
            "--warmup-steps",
            "2",
            "--log-dir",
            str(t / "logs"),
            "-o",
            str(cfg),
        )
        dstk_times, minimal_times = [], []
        for pair in range(args.pairs):
            run = t / f"dstk{pair}"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "toolkit.cli",
                    "launch",
                    "--cluster",
                    "cpu",
                    "--config",
                    str(cfg),
                    "--run-dir",
                    str(run / "launch"),
                    "--master-port",
                    str(29800 + pair),
                    "--",
                    "--model",
                    MODEL,
                    "--data",
                    str(t / "data"),
                    "--steps",
                    str(args.steps),
                    "--run-dir",
                    str(run),
                    "--no-progress",
                    "--log-every",
                    str(args.steps),
                ],
                check=True,
                cwd=REPO,
                env=env,
                capture_output=True,
            )
            dstk_times.append(json.loads((run / "summary.json").read_text())["step_times_s"][2:])
            out = t / f"minimal{pair}.json"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "deepspeed.launcher.runner",
                    "--num_gpus",
                    "2",
                    "--master_port",
                    str(29900 + pair),
                    "--no_local_rank",
                    str(REPO / "benchmarks" / "minimal_loop.py"),
                    MODEL,
                    str(cfg),
                    str(t / "data"),
                    str(args.steps),
                    str(out),
                ],
                check=True,
                cwd=REPO,
                env=env,
                capture_output=True,
            )
            minimal_times.append(json.loads(out.read_text())["step_times_s"][2:])
            print(
                f"pair {pair}: dstk {statistics.median(dstk_times[-1]) * 1e3:.1f} ms, "
                f"minimal {statistics.median(minimal_times[-1]) * 1e3:.1f} ms",
                flush=True,
            )
    d = statistics.median([x for r in dstk_times for x in r])
    m = statistics.median([x for r in minimal_times for x in r])
    print(f"median step: dstk train {d * 1e3:.2f} ms, minimal loop {m * 1e3:.2f} ms, ratio {d / m:.3f}")
    write_json(
        "overhead",
        {
            "dstk_median_s": d,
            "minimal_median_s": m,
            "ratio": d / m,
            "pairs": args.pairs,
            "steps": args.steps,
            "model": MODEL,
        },
    )
    result_path("overhead", "md").write_text(
        f"# dstk train overhead\n\nCommand: `python benchmarks/overhead.py --pairs {args.pairs} --steps {args.steps}`\n\n"
        f"| | median step (ms) |\n|---|---|\n| dstk train | {d * 1e3:.2f} |\n| minimal deepspeed loop | {m * 1e3:.2f} |\n"
        f"| ratio | {d / m:.3f} |\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
