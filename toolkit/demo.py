"""`make demo`: the whole path on this machine, as a user would run it, one printed command at a time.

generate a corpus → prepare it (local BPE tokenizer, packing) → calibrate this machine (30 s once
DeepSpeed's CPU op is built, which `make install` does; once per host: the result is cached) → plan a tiny
GPT for `--cluster local`, which picks the precision this host computes fastest (fp32 where bf16 is emulated) → write its DeepSpeed config → launch → ~100 steps with the
loss falling → measured vs predicted → the checkpoint, exported as an HF model. Nothing here depends on the
host having native bf16 or being the one the presets came from.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("demo_out")
MODEL = "tiny-gpt2"
CLUSTER = "local"
STEPS = 100


def dstk(*args: str) -> None:
    print(f"\n$ dstk {' '.join(shlex.quote(a) for a in args)}", flush=True)
    code = subprocess.call([sys.executable, "-m", "toolkit.cli", *args])
    if code:
        sys.exit(f"demo: dstk {args[0]} failed with exit status {code}")


def loss_curve(losses: list[float], width: int = 50) -> str:
    """A text plot of the loss per step: one row per tenth of the run."""
    top, bottom = max(losses), min(losses)
    rows = []
    for i in range(0, len(losses), max(1, len(losses) // 10)):
        bar = int((losses[i] - bottom) / (top - bottom or 1) * width)
        rows.append(f"  step {i + 1:>4}  {losses[i]:7.3f}  {'#' * max(bar, 1)}")
    rows.append(f"  step {len(losses):>4}  {losses[-1]:7.3f}")
    return "\n".join(rows)


def main() -> None:
    start = time.time()
    raw, data, cfg = OUT / "raw", OUT / "data", OUT / "ds_config.json"
    # every step below writes into demo_out/, the demo's own folder: a rerun replaces what the last one wrote,
    # and says so with the flags that allow it (nothing is replaced without one)
    dstk("data", "generate", "--out", str(raw), "--overwrite")
    dstk(
        "data",
        "prepare",
        "--input",
        *sorted(str(p) for p in raw.glob("*.jsonl")),
        "--out",
        str(data),
        "--overwrite",  # a rerun of the demo replaces its own earlier dataset
        "--seq-length",
        "128",
        "--train-tokenizer",
        "2048",
    )
    dstk("calibrate", "--reuse")
    dstk("plan", "--model", MODEL, "--cluster", CLUSTER, "--global-batch", "16")
    dstk(
        "config",
        "--plan",
        "--model",
        MODEL,
        "--cluster",
        CLUSTER,
        "--global-batch",
        "16",
        "--lr",
        "1e-3",
        "--train-steps",
        str(STEPS),
        "--warmup-steps",
        "10",
        "--log-dir",
        str(OUT / "logs"),
        "-o",
        str(cfg),
    )
    dstk(
        "launch",
        "--cluster",
        CLUSTER,
        "--config",
        str(cfg),
        "--run-dir",
        str(OUT / "launch"),
        "--",
        "--model",
        MODEL,
        "--data",
        str(data),
        "--steps",
        str(STEPS),
        "--run-dir",
        str(OUT / "run"),
        "--checkpoint-dir",
        str(OUT / "checkpoints"),
        "--overwrite-checkpoints",  # a rerun trains from step 0 again, in place of the last run's checkpoints
        "--eval-every",
        "50",
        "--log-every",
        "10",
    )
    summary = json.loads((OUT / "run" / "summary.json").read_text())
    print("\nLoss per step (2 CPU ranks, DeepSpeed engine):")
    print(loss_curve(summary["losses"]))
    for e in summary["evals"]:
        print(f"  held-out after step {e['step']}: loss {e['loss']:.3f}, perplexity {e['perplexity']:.1f}")
    dstk(
        "export",
        "--model",
        MODEL,
        "--checkpoint",
        str(OUT / "checkpoints"),
        "--tokenizer",
        str(data / "tokenizer"),
        "--out",
        str(OUT / "hf_model"),
        "--overwrite",
    )
    print(
        f"\nCheckpoints: {OUT / 'checkpoints'}; HF model: {OUT / 'hf_model'}; metrics: {OUT / 'run' / 'metrics.jsonl'}; "
        f"TensorBoard/CSV: {OUT / 'logs'}. Demo took {time.time() - start:.0f} s."
    )


if __name__ == "__main__":
    main()
