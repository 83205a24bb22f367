"""AdamW vs 1-bit Adam vs 0/1 Adam on the same task: bytes sent per step, step time, loss curve.

A GPT-2 (from transformers.GPT2Config, no dropout) trains on a random Markov chain over `--states` tokens with
2 equally likely successors each (loss floor ln 2 ≈ 0.693) on 2 gloo ranks through the real DeepSpeed engine
(ZeRO-0, fp32). AdamW uses the engine's gradient all-reduce, whose bytes are counted analytically (a ring
all-reduce of the fp32 gradients, 2(W-1)/W · 4 · params per step); the dstk optimizers count theirs at each
collective call (`optimizer.wire`). Step time is the median wall time of the steps after the first 3.
Writes benchmarks/results/onebit_<hardware>_<date>.{json,csv,png}.

On 2 CPU ranks on one machine the collectives are memory copies, so step time shows the compression's
compute cost, not a network saving; the bytes column is what a network would carry.
Usage: python benchmarks/onebit.py [--steps 200] [--freeze-step 40] [--n-layer 4] [--n-embd 128]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import result_path, write_json

REPO = Path(__file__).resolve().parents[1]
OPTIMIZERS = ("adamw", "onebit-adam", "zero-one-adam")


def markov(n: int, seq: int, states: int, seed: int) -> Any:
    """`n` sequences of a fixed random chain: each token has 2 equally likely successors."""
    import torch

    table = torch.Generator().manual_seed(7)
    succ = torch.stack([torch.randperm(states, generator=table)[:2] for _ in range(states)])
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n, seq, dtype=torch.long)
    x[:, 0] = torch.randint(0, states, (n,), generator=g)
    for i in range(1, seq):
        x[:, i] = succ[x[:, i - 1], torch.randint(0, 2, (n,), generator=g)]
    return x


def run_one(name: str, args: argparse.Namespace, rank: int, world: int) -> dict[str, Any]:
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel

    from toolkit.parallel.onebit import attach_to_engine, build_optimizer
    from toolkit.parallel.onebit_comm import ring_allreduce_bytes

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=args.n_layer, n_embd=args.n_embd, n_head=4, vocab_size=args.vocab, n_positions=args.seq
    )
    cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0
    model = GPT2LMHeadModel(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    adam = {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    if name == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)
    elif name == "onebit-adam":
        optimizer = build_optimizer(
            model.parameters(), {"type": name, "params": {**adam, "freeze_step": args.freeze_step}}
        )
    else:
        spec = {
            "var_freeze_step": args.freeze_step,
            "local_step_scaler": args.local_step_scaler,
            "local_step_clipper": 4,
        }
        optimizer = build_optimizer(model.parameters(), {"type": name, "params": {**adam, **spec}})
    ds = {"train_micro_batch_size_per_gpu": args.micro_batch, "gradient_accumulation_steps": 1}
    ds.update(zero_optimization={"stage": 0}, steps_per_print=10**9)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds)
    if name != "adamw":
        attach_to_engine(engine)
    engine_bytes = ring_allreduce_bytes(n_params, world, 4)  # the engine's fp32 gradient all-reduce
    rows = []
    for step in range(1, args.steps + 1):
        ids = markov(args.micro_batch, args.seq, args.states, seed=step * world + rank).to(engine.device)
        sent = optimizer.wire.bytes if name != "adamw" else 0.0
        dist.barrier()
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        elapsed = time.perf_counter() - start
        t = torch.tensor([float(loss.detach()), elapsed], dtype=torch.float64)
        dist.all_reduce(t)
        wire = engine_bytes if name == "adamw" else optimizer.wire.bytes - sent
        rows.append({"optimizer": name, "step": step, "loss": float(t[0]) / world, "wire_bytes": wire,
                     "step_time_s": float(t[1]) / world})  # fmt: skip
    with torch.no_grad():
        ids = markov(64, args.seq, args.states, seed=2**31 - 1).to(engine.device)
        eval_loss = float(engine.module(input_ids=ids, labels=ids).loss)
    return {"n_params": n_params, "rows": rows, "eval_loss": eval_loss}


def worker(args: argparse.Namespace) -> None:
    """One rank of the benchmark job (started by `main` through the deepspeed launcher)."""
    from toolkit.run.runtime import init_distributed, shutdown

    rt = init_distributed()
    results = {name: run_one(name, args, rt.rank, rt.world_size) for name in OPTIMIZERS}
    if rt.rank == 0:
        Path(args.worker_out).write_text(json.dumps(results))
    shutdown()


def summarise(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    summary = {}
    for name, r in results.items():
        rows = r["rows"]
        sent = [row["wire_bytes"] for row in rows]
        summary[name] = {
            "eval_loss": r["eval_loss"],
            "final_train_loss_mean_last10": statistics.fmean(row["loss"] for row in rows[-10:]),
            "total_bytes": sum(sent),
            "bytes_per_step_after_freeze": statistics.fmean(sent[args.freeze_step :]),
            "median_step_time_s": statistics.median(row["step_time_s"] for row in rows[3:]),
        }
    base = summary["adamw"]
    for s in summary.values():
        s["bytes_vs_adamw"] = s["total_bytes"] / base["total_bytes"]
        s["bytes_after_freeze_vs_adamw"] = (
            s["bytes_per_step_after_freeze"] / base["bytes_per_step_after_freeze"]
        )
        s["eval_loss_vs_adamw"] = s["eval_loss"] / base["eval_loss"]
    return summary


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_bytes) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in results.items():
        steps = [row["step"] for row in r["rows"]]
        ax_loss.plot(steps, [row["loss"] for row in r["rows"]], label=name)
        cumulative, total = [], 0.0
        for row in r["rows"]:
            total += row["wire_bytes"]
            cumulative.append(total / 2**20)
        ax_bytes.plot(steps, cumulative, label=name)
    ax_loss.axhline(math.log(2), color="grey", linestyle=":", label="floor ln 2")
    ax_loss.set(xlabel="step", ylabel="training loss (mean of ranks)", yscale="log")
    ax_bytes.set(xlabel="step", ylabel="MiB sent per rank (cumulative)")
    for ax in (ax_loss, ax_bytes):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--freeze-step", type=int, default=40, help="1-bit Adam freeze_step, 0/1 Adam var_freeze_step"
    )
    parser.add_argument(
        "--local-step-scaler", type=int, default=20, help="0/1 Adam (DeepSpeed's default: 32678)"
    )
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--states", type=int, default=64)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_out:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        forwarded = sys.argv[1:]
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--no_local_rank",
               "--master_port", str(_free_port()), str(Path(__file__).resolve()), *forwarded,
               "--worker-out", str(out)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if not out.is_file():
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
            return 1
        results = json.loads(out.read_text())
    with result_path("onebit", "csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["optimizer", "step", "loss", "wire_bytes", "step_time_s"])
        writer.writeheader()
        for r in results.values():
            writer.writerows(r["rows"])
    png = result_path("onebit", "png")
    plot(results, png)
    summary = summarise(results, args)
    settings = {k: v for k, v in vars(args).items() if k != "worker_out"}
    n_params = results["adamw"]["n_params"]
    path = write_json(
        "onebit", {"settings": settings, "n_params": n_params, "world_size": 2, "summary": summary}
    )
    for name, s in summary.items():
        print(
            f"{name:14s} eval loss {s['eval_loss']:.4f} ({s['eval_loss_vs_adamw']:.3f}× AdamW)  "
            f"bytes {s['bytes_vs_adamw']:.3f}× AdamW (after freeze {s['bytes_after_freeze_vs_adamw']:.4f}×)  "
            f"step {1e3 * s['median_step_time_s']:.1f} ms"
        )
    print(f"wrote {path}, {png} and the CSV beside them")
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    raise SystemExit(main())
