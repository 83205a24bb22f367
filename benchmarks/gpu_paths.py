"""The run paths of `dstk train` that a GPU check must see complete: tiny models, a few steps each.

Each path is `dstk config` + `dstk launch` (→ `dstk train`) on this machine's accelerator (`--cluster local`),
checked by its summary (every step ran, the loss is finite) and, for the checkpoint path, by a resume:
- `async_checkpoint`: checkpoints persisted from pinned host buffers by the writer thread and its side
  stream (`--async-save`), shared-memory snapshots, then a second launch resuming from them (`--resume auto`);
- `activation_offload`: full recomputation with the block inputs in host memory (DeepSpeed's checkpointing);
- `cpu_adam`: ZeRO-2 with the optimizer on the host (DeepSpeedCPUAdam, a JIT-built op);
- `fused_adam`: ZeRO-1 with DeepSpeed's FusedAdam (a JIT-built CUDA op; the CPU accelerator uses torch's);
- `lora`: adapters trained, the base frozen (peft);
- `moe_native_ep1`: HF's own Mixtral blocks, routed by HF's router, no expert parallelism.
Runs `--parallel` of them at a time (default 2: on one GPU they are tiny). Writes OUT/gpu_paths.json.
Usage: python benchmarks/gpu_paths.py --out DIR [--steps N] [--parallel N] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import REPO, bench_env, dstk, free_port

LLAMA = str(REPO / "tests" / "models" / "tiny-test-llama.yaml")
MIXTRAL = str(REPO / "tests" / "models" / "tiny-test-mixtral.yaml")
# name: (model, dstk config layout flags, dstk train flags)
PATHS: dict[str, tuple[str, list[str], list[str]]] = {
    "async_checkpoint": (
        LLAMA,
        ["--zero-stage", "2"],
        ["--save-every", "4", "--async-save", "--snapshot-every", "3"],
    ),
    "activation_offload": (LLAMA, ["--zero-stage", "2", "--recompute", "full", "--offload-activations"], []),
    "cpu_adam": (LLAMA, ["--zero-stage", "2", "--offload-optimizer", "cpu"], []),
    "fused_adam": (LLAMA, ["--zero-stage", "1"], []),
    "lora": (LLAMA, ["--zero-stage", "2"], ["--lora", "r=8,alpha=16"]),
    "moe_native_ep1": (MIXTRAL, ["--zero-stage", "2", "--ep", "1"], []),
}


def _launch(
    cfg: Path, model: str, data: Path, steps: int, run: Path, extra: list[str]
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "toolkit.cli", "launch", "--cluster", "local", "--config", str(cfg)]
    cmd += ["--run-dir", str(run / "launch"), "--master-port", str(free_port()), "--"]
    cmd += ["--model", model, "--data", str(data), "--steps", str(steps), "--run-dir", str(run)]
    cmd += ["--no-progress", "--log-every", "2", *extra]
    return subprocess.run(cmd, cwd=REPO, env=bench_env(), capture_output=True, text=True)


def run_path(name: str, tmp: Path, data: Path, steps: int) -> dict:
    model, layout, train = PATHS[name]
    d = tmp / name
    t0 = time.time()
    out: dict = {"name": name, "layout": layout, "train": train}
    try:
        cfg = d / "ds.json"
        dstk(
            *("config", "--model", model, "--cluster", "local", "--global-batch", "8", "--lr", "1e-3"),
            *("--train-steps", str(steps + 4), "--warmup-steps", "2", "--log-dir", str(d / "logs")),
            *([*layout, "-o", str(cfg)]),
        )
        ckpt = ["--checkpoint-dir", str(d / "ckpt")] if name == "async_checkpoint" else []
        proc = _launch(cfg, model, data, steps, d / "run", train + ckpt)
        out["rc"], out["tail"] = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
        if proc.returncode == 0:
            s = json.loads((d / "run" / "summary.json").read_text())
            out.update(final_step=s["final_step"], losses=s["losses"], step_time_s=s["step_time_s"])
            out["ok"] = s["final_step"] == steps and all(math.isfinite(x) for x in s["losses"])
        if name == "async_checkpoint" and out.get("ok"):
            proc = _launch(cfg, model, data, steps + 4, d / "resumed", [*ckpt, "--resume", "auto"])
            out["resume_rc"] = proc.returncode
            resumed = proc.stdout + proc.stderr
            out["resumed_from"] = next((ln for ln in resumed.splitlines() if "resumed from" in ln), None)
            out["ok"] = proc.returncode == 0 and out["resumed_from"] is not None
            if not out["ok"]:
                out["tail"] = resumed[-1500:]
    except SystemExit as exc:  # benchmarks.common.dstk stops on a failed command: keep its message
        out["rc"], out["tail"], out["ok"] = 1, str(exc)[-1500:], False
    out["seconds"] = round(time.time() - t0, 1)
    print(f"{name}: {'ok' if out.get('ok') else 'FAILED'} in {out['seconds']} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--only", default=",".join(PATHS))
    args = ap.parse_args()
    names = args.only.split(",")
    with tempfile.TemporaryDirectory(prefix="dstk-gpu-paths-") as d:
        tmp = Path(d)
        dstk("data", "generate", "--out", str(tmp / "raw"), "--docs-per-domain", "200")
        raw = [str(p) for p in sorted((tmp / "raw").glob("*.jsonl"))]
        dstk(
            "data",
            "prepare",
            "--input",
            *raw,
            "--out",
            str(tmp / "data"),
            "--seq-length",
            "64",
            "--train-tokenizer",
            "512",
        )
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda n: run_path(n, tmp, tmp / "data", args.steps), names))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_paths.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
