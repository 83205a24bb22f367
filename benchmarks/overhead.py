"""What `dstk train` costs over a bare `deepspeed.initialize` loop, and whether its step time stays flat.

Two cases on 2 CPU ranks, fp32 (no host depends on native bf16):
- `small`: a 2-layer, 64-wide GPT-2 at 64 tokens, whose step is 10–30 ms — where a per-step Python cost or a
  device wait dstk adds would show (on a GPU a real model's step is tens of milliseconds too);
- `tiny-gpt2`: the 4-layer, 256-wide preset at 128 tokens (~0.25 s a step).
Per case, dstk train and benchmarks/minimal_loop.py (forward, backward, step, the loss printed every 10 steps,
as users write it) run interleaved (A B A B ...) so machine noise hits both; the figure is the ratio of their
median step *periods* — the time between consecutive step ends, so everything a loop does per step counts, not
only the engine's work. Goal: ≤ 1.03.
Then one long `small` run of each (--flat-steps, default 1000): the median period of the last 100 steps over
that of the 100 after warm-up (goal: within ±3 %). A cost that grows with the step count — DeepSpeed's comms
logger left on re-reads every timer event since the start at every collective — shows here.
Usage: python benchmarks/overhead.py [--pairs 3] [--steps 300] [--tiny-steps 60] [--flat-steps 1000]
                                    [--cases small,tiny-gpt2]
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
from benchmarks.common import command_line, result_path, write_json

REPO = Path(__file__).resolve().parents[1]
SMALL = """name: overhead-small
architecture: gpt2
n_layers: 2
hidden_size: 64
n_heads: 4
vocab_size: 512
seq_length: 64
max_position_embeddings: 64
dropout: false
"""
# case: (model reference, tokenizer vocabulary, ZeRO stage, micro-batch, global batch)
CASES = {"small": ("{tmp}/small.yaml", 512, 1, 4, 8), "tiny-gpt2": ("tiny-gpt2", 2048, 2, 8, 16)}
WARMUP = 10
"""Steps left out at the start of every run (JIT, allocator, lazily created optimizer state)."""
LOG_EVERY = 10


def _dstk(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "toolkit.cli", *args], check=True, cwd=REPO, capture_output=True)


def _prepare(t: Path, case: str, steps: int) -> tuple[str, Path, Path]:
    model, vocab, stage, micro, gb = CASES[case]
    model = model.format(tmp=t)
    (t / "small.yaml").write_text(SMALL)
    seq = 64 if case == "small" else 128
    data = t / f"data-{case}"
    if not data.exists():
        if not (t / "raw").exists():
            _dstk("data", "generate", "--out", str(t / "raw"))
        raw = [str(p) for p in sorted((t / "raw").glob("*.jsonl"))]
        _dstk(
            *("data", "prepare", "--input", *raw, "--out", str(data), "--seq-length", str(seq)),
            *("--train-tokenizer", str(vocab)),
        )
    cfg = t / f"{case}-{steps}.json"
    _dstk(
        "config",
        *("--model", model, "--cluster", "cpu", "--precision", "fp32", "--zero-stage", str(stage)),
        *("--micro-batch", str(micro), "--global-batch", str(gb), "--train-steps", str(steps)),
        *("--warmup-steps", "2", "--log-dir", str(t / "logs"), "-o", str(cfg)),
    )
    return model, data, cfg


def _run_dstk(t: Path, name: str, model: str, cfg: Path, data: Path, steps: int, port: int) -> list[float]:
    run = t / name
    subprocess.run(
        [
            *(sys.executable, "-m", "toolkit.cli", "launch", "--cluster", "cpu", "--config", str(cfg)),
            *("--run-dir", str(run / "launch"), "--master-port", str(port), "--"),
            *("--model", model, "--data", str(data), "--steps", str(steps), "--run-dir", str(run)),
            *("--log-every", str(LOG_EVERY)),
        ],
        check=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
    )
    return json.loads((run / "summary.json").read_text())["step_periods_s"]


def _run_minimal(t: Path, name: str, model: str, cfg: Path, data: Path, steps: int, port: int) -> list[float]:
    out = t / f"{name}.json"
    subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "deepspeed.launcher.runner",
                "--num_gpus",
                "2",
                "--master_port",
                str(port),
            ),
            *("--no_local_rank", str(REPO / "benchmarks" / "minimal_loop.py"), model, str(cfg), str(data)),
            *(str(steps), str(out), str(LOG_EVERY)),
        ],
        check=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
    )
    return json.loads(out.read_text())["step_periods_s"]


def _steady(periods: list[float | None]) -> list[float]:
    return [p for p in periods[WARMUP:] if p is not None]


def _flatness(periods: list[float | None]) -> dict[str, float]:
    steady = _steady(periods)
    early, late = statistics.median(steady[:100]), statistics.median(steady[-100:])
    return {"early_median_s": early, "late_median_s": late, "late_over_early": late / early}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="steps of each paired run of the small case")
    parser.add_argument("--tiny-steps", type=int, default=60, help="steps of each paired tiny-gpt2 run")
    parser.add_argument("--flat-steps", type=int, default=1000, help="steps of the long runs (0: none)")
    parser.add_argument("--cases", default="small,tiny-gpt2")
    args = parser.parse_args()
    record: dict = {"pairs": args.pairs, "steps": args.steps, "flat_steps": args.flat_steps, "cases": {}}
    port = 29800
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for case in args.cases.split(","):
            steps = args.steps if case == "small" else args.tiny_steps
            model, data, cfg = _prepare(t, case, steps)
            dstk_runs, bare_runs = [], []
            for pair in range(args.pairs):
                port += 2
                dstk_runs.append(_steady(_run_dstk(t, f"d-{case}{pair}", model, cfg, data, args.steps, port)))
                bare_runs.append(
                    _steady(_run_minimal(t, f"m-{case}{pair}", model, cfg, data, args.steps, port + 1))
                )
                print(
                    f"{case} pair {pair}: dstk {statistics.median(dstk_runs[-1]) * 1e3:.2f} ms, "
                    f"bare {statistics.median(bare_runs[-1]) * 1e3:.2f} ms",
                    flush=True,
                )
            d = statistics.median([x for r in dstk_runs for x in r])
            m = statistics.median([x for r in bare_runs for x in r])
            print(
                f"{case}: median step period dstk train {d * 1e3:.2f} ms, bare loop {m * 1e3:.2f} ms, ratio {d / m:.3f}"
            )
            record["cases"][case] = {"dstk_median_s": d, "bare_median_s": m, "ratio": d / m, "steps": steps}
        if args.flat_steps:
            model, data, cfg = _prepare(t, "small", args.flat_steps)
            flat = {
                "dstk": _flatness(_run_dstk(t, "d-flat", model, cfg, data, args.flat_steps, port + 10)),
                "bare": _flatness(_run_minimal(t, "m-flat", model, cfg, data, args.flat_steps, port + 11)),
            }
            for who, f in flat.items():
                print(
                    f"{who} {args.flat_steps} steps: median period {f['early_median_s'] * 1e3:.2f} ms (steps "
                    f"{WARMUP + 1}-{WARMUP + 100}) -> {f['late_median_s'] * 1e3:.2f} ms (last 100): "
                    f"x{f['late_over_early']:.3f}"
                )
            record["flat"] = flat
    write_json("overhead", record)
    lines = [
        "# dstk train overhead and flatness",
        "",
        f"Command: `{command_line()}` (2 CPU ranks, fp32; step period = time between consecutive step ends; "
        f"first {WARMUP} steps of each run left out)",
        "",
        "| case | steps per run | dstk train (ms) | bare DeepSpeed loop (ms) | ratio (goal ≤ 1.03) |",
        "|---|---|---|---|---|",
        *(
            f"| {c} | {r['steps']} | {r['dstk_median_s'] * 1e3:.2f} | {r['bare_median_s'] * 1e3:.2f} | {r['ratio']:.3f} |"
            for c, r in record["cases"].items()
        ),
    ]
    if "flat" in record:
        lines += [
            "",
            f"Flatness, `small`, {args.flat_steps} steps (goal: last 100 within ±3 % of the 100 after warm-up):",
            "",
            "| loop | median period, steps 11–110 (ms) | median period, last 100 (ms) | ratio |",
            "|---|---|---|---|",
            *(
                f"| {who} | {f['early_median_s'] * 1e3:.2f} | {f['late_median_s'] * 1e3:.2f} | {f['late_over_early']:.3f} |"
                for who, f in record["flat"].items()
            ),
        ]
    result_path("overhead", "md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
