"""Progressive training: the big model trained from scratch vs a small model trained first and then grown, at
equal training compute (6·N·tokens, Kaplan et al. 2020), on 2 ranks through the real run path.

Arms (each a `dstk grow --schedule` run, i.e. dstk config --plan → dstk launch → dstk grow → dstk launch):
- scratch: the big model for S steps.
- depth: the half-depth model for S₁ steps, grown with `dstk grow` (stack, new blocks' output projections
  zeroed: the function is kept), then the big model for S₂ steps, with 6·N_small·S₁ + 6·N_big·S₂ = 6·N_big·S
  (same global batch and sequence length, so tokens per step are equal);
- copy: the same small run (shared), grown by plain copy-stacking (the function changes);
- width (full run only): a half-width, half-depth model grown in width ×2 (Net2Net-style, function-preserving)
  and depth ×2.
`--small-fraction` (0.5) is the share of the compute spent on the small model. Every run evaluates on the same
64 validation rows every `eval_every` steps; `dstk grow` measures the validation loss right before and after
growing. N counts every parameter (embeddings included), as `ModelSpec.n_params` does. Each segment has its own
warm-up + cosine schedule (dstk config's), and the grown segment's data order is reseeded (see
toolkit/plan/progressive.py).

Writes benchmarks/results/progressive[_quick]_<hardware>_<date>.{csv,md,png,json} (or under --out-dir).
Usage: python benchmarks/progressive.py [--quick] [--steps S] [--small-fraction F] [--out-dir DIR] [--work-dir DIR]
       (--quick: tiny models and 60 steps, under 3 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import result_path, stamp, write_json
from toolkit.plan.params import count_params

REPO = Path(__file__).resolve().parents[1]
QUICK = dict(vocab=512, seq=64, layers=4, hidden=64, heads=4, batch=8, micro=4, steps=60, eval_every=10, lr=3e-3,
             docs=600, arms=("scratch", "depth", "copy"))  # fmt: skip
FULL = dict(vocab=1024, seq=64, layers=8, hidden=128, heads=4, batch=16, micro=8, steps=300, eval_every=30,
            lr=1e-3, docs=3000, arms=("scratch", "depth", "copy", "width"))  # fmt: skip
COLUMNS = ["arm", "stage", "model", "step", "tokens", "flops", "train_loss", "val_loss"]


def model(s: dict[str, Any], name: str, layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return dict(name=name, architecture="gpt2", n_layers=layers, hidden_size=hidden, n_heads=heads,
                vocab_size=s["vocab"], seq_length=s["seq"], max_position_embeddings=s["seq"], dropout=False)  # fmt: skip


def dstk(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args], cwd=REPO, capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(f"dstk {args[0]} failed:\n{proc.stderr[-3000:]}")


def plan_steps(n_small: int, n_big: int, steps: int, fraction: float, every: int) -> tuple[int, int]:
    """(S₁, S₂): S₂ a multiple of the eval interval, S₁ so that 6·N_small·S₁ + 6·N_big·S₂ = 6·N_big·S."""
    s2 = max(every, round((1 - fraction) * steps / every) * every)
    s1 = max(1, round((steps - s2) * n_big / n_small))
    return s1, s2


def rows_of(arm: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per step: cumulative tokens and FLOPs, the training loss, and the validation loss where evaluated."""
    rows, tokens, flops = [], 0, 0.0
    for i, st in enumerate(result["stages"]):
        if "grow" in st:  # the growth itself: validation loss right before and right after
            c = st["grow"]["check"]
            for label, loss in (("parent", c["parent_loss"]), ("grown", c["grown_loss"])):
                rows.append(dict(arm=arm, stage=f"{i}:{label}", model=st["model"], step=0, tokens=tokens,
                                 flops=flops, train_loss=None, val_loss=loss))  # fmt: skip
        evals = {e["step"]: e["loss"] for e in st["evals"]}
        per_flops = 6 * st["n_params"] * st["tokens_per_step"]
        for step, loss in enumerate(st["losses"], start=1):
            tokens += st["tokens_per_step"]
            flops += per_flops
            rows.append(dict(arm=arm, stage=str(i), model=st["model"], step=step, tokens=tokens, flops=flops,
                             train_loss=loss, val_loss=evals.get(step)))  # fmt: skip
    return rows


def run_arms(s: dict[str, Any], args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, Any]]:
    import yaml

    from toolkit.plan.load import load_model
    from toolkit.plan.progressive import Schedule, Stage, run_schedule

    specs = {
        "big": model(s, "big", s["layers"], s["hidden"], s["heads"]),
        "small": model(s, "small", s["layers"] // 2, s["hidden"], s["heads"]),
        "narrow": model(s, "narrow", s["layers"] // 2, s["hidden"] // 2, s["heads"] // 2),
    }
    paths = {}
    for name, spec in specs.items():
        paths[name] = str(tmp / f"{name}.yaml")
        Path(paths[name]).write_text(yaml.safe_dump(spec))
    n = {name: count_params(load_model(path)).total for name, path in paths.items()}
    if not (tmp / "data" / "manifest.json").is_file():
        dstk("data", "generate", "--out", str(tmp / "raw"), "--docs-per-domain", str(s["docs"]))
        dstk("data", "prepare", "--input", *map(str, sorted((tmp / "raw").glob("*.jsonl"))), "--out",
             str(tmp / "data"), "--seq-length", str(s["seq"]), "--train-tokenizer", str(s["vocab"]),
             "--validation-fraction", "0.05")  # fmt: skip
    common = dict(
        data=str(tmp / "data"),
        gpus_per_node=2,
        config=["--precision", "fp32", "--zero-stage", "0", "--micro-batch", str(s["micro"]), "--global-batch",
                str(s["batch"]), "--lr", str(s["lr"]), "--recompute", "none"],
        train=["--log-every", str(s["eval_every"]), "--eval-every", str(s["eval_every"]), "--eval-rows", "64"],
    )  # fmt: skip
    steps, every = s["steps"], s["eval_every"]
    arms: dict[str, Schedule] = {"scratch": Schedule(run_dir=str(tmp / "scratch"), stages=[Stage(model=paths["big"], steps=steps)], **common)}  # fmt: skip
    for arm, small, grow in (
        ("depth", "small", []),
        ("copy", "small", ["--new-blocks", "copy"]),
        ("width", "narrow", []),
    ):
        s1, s2 = plan_steps(n[small], n["big"], steps, args.small_fraction, every)
        stages = [Stage(model=paths[small], steps=s1), Stage(model=paths["big"], steps=s2, grow=grow)]
        arms[arm] = Schedule(run_dir=str(tmp / arm), stages=stages, **common)
    (tmp / "copy").mkdir(exist_ok=True)
    if not (tmp / "copy" / "stage0").is_symlink():
        (tmp / "copy" / "stage0").symlink_to(tmp / "depth" / "stage0")  # the copy arm shares the small run
    results = {}
    for arm in s["arms"]:
        print(f"== {arm}", flush=True)
        results[arm] = run_schedule(arms[arm])
        # the copy arm's small stage is the depth arm's (shared), so its wall time counts only its own stage
        results[arm]["wall_s"] = sum(
            st.get("wall_s", 0.0) for st in results[arm]["stages"][1 if arm == "copy" else 0 :]
        )
    return results


def summarise(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for arm, r in results.items():
        last = r["stages"][-1]
        out[arm] = {
            "stages": [f"{st['model']}×{st['steps']}" for st in r["stages"]],
            "tokens": r["total_tokens"],
            "flops": r["total_flops"],
            "final_val_loss": last["evals"][-1]["loss"] if last["evals"] else None,
            "final_train_loss_mean_last5": sum(last["losses"][-5:]) / len(last["losses"][-5:]),
            "wall_s": r["wall_s"],
        }
        if "grow" in last:
            c = last["grow"]["check"]
            out[arm]["growth"] = {k: c[k] for k in ("parent_loss", "grown_loss", "abs_diff")}
    base = out["scratch"]
    for s in out.values():
        s["flops_vs_scratch"] = s["flops"] / base["flops"]
        if s["final_val_loss"] and base["final_val_loss"]:
            s["val_loss_minus_scratch"] = s["final_val_loss"] - base["final_val_loss"]
    return out


def plot(rows: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    """Validation loss vs compute (whole run, and zoomed on the part after growth, where the arms differ by
    hundredths) and the smoothed training loss vs tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_val, ax_zoom, ax_train) = plt.subplots(1, 3, figsize=(17, 4.5))
    budget = max(r["flops"] for r in rows)
    zoom: list[float] = []
    for arm in summary:
        mine = [r for r in rows if r["arm"] == arm]
        val = [r for r in mine if r["val_loss"] is not None]
        x, y = [r["flops"] / 1e12 for r in val], [r["val_loss"] for r in val]
        (line,) = ax_val.plot(x, y, marker=".", label=arm)
        late = [(a, b) for a, b in zip(x, y, strict=True) if a * 1e12 >= 0.45 * budget]
        ax_zoom.plot(
            [a for a, _ in late], [b for _, b in late], marker=".", color=line.get_color(), label=arm
        )
        zoom += [b for _, b in late]
        for r in mine:
            if r["stage"].endswith(":grown"):
                for ax in (ax_val, ax_zoom):
                    ax.axvline(r["flops"] / 1e12, color=line.get_color(), linestyle=":", linewidth=0.8)
        train = [r for r in mine if r["train_loss"] is not None]
        k = 5  # moving average over 5 steps: the per-step training loss is noisy at this batch size
        smooth = [sum(r["train_loss"] for r in train[max(0, i - k + 1) : i + 1]) / len(train[max(0, i - k + 1) : i + 1])
                  for i in range(len(train))]  # fmt: skip
        ax_train.plot(
            [r["tokens"] / 1e3 for r in train], smooth, color=line.get_color(), label=arm, linewidth=0.8
        )
    compute = "training compute, TFLOPs (6·N·tokens)"
    ax_val.set(xlabel=compute, ylabel="validation loss", title="equal compute (dotted: growth)")
    ax_zoom.set(xlabel=compute, ylabel="validation loss", title="the same, from 45 % of the budget")
    if zoom:
        ax_zoom.set_ylim(min(zoom) - 0.02 * (max(zoom) - min(zoom) + 0.1), max(zoom) + 0.02)
    ax_train.set(
        xlabel="tokens (thousands)", ylabel="training loss (moving average of 5)", title="loss vs tokens"
    )
    finals = [r["train_loss"] for r in rows if r["train_loss"] is not None and r["flops"] >= 0.3 * budget]
    if finals:
        ax_train.set_ylim(min(finals) - 0.05, max(finals) + 0.1)
    for ax in (ax_val, ax_zoom, ax_train):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(rows: list[dict[str, Any]], summary: dict[str, Any], settings: dict[str, Any], args: argparse.Namespace) -> dict[str, Path]:  # fmt: skip
    tag = "progressive_quick" if args.quick else "progressive"
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        k: (args.out_dir / f"{tag}.{k}" if args.out_dir else result_path(tag, k))
        for k in ("csv", "md", "png", "json")
    }
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    record = {"settings": settings, "summary": summary}
    if args.out_dir:
        paths["json"].write_text(json.dumps({**stamp(), **record}, indent=2, sort_keys=True) + "\n")
    else:
        write_json(tag, record)
    env = stamp()
    lines = [
        f"# Progressive training: from scratch vs small-then-grow at equal compute ({settings['world_size']} ranks)",
        "",
        f"Command: `{env['command']}` ({env['date']})",
        "",
        "| arm | stages (model × steps) | tokens | TFLOPs (6·N·tokens) | × scratch | final val loss | Δ vs scratch | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in summary.items():
        delta = s.get("val_loss_minus_scratch")
        lines.append(
            f"| {arm} | {' → '.join(s['stages'])} | {s['tokens']:,} | {s['flops'] / 1e12:.3f} | {s['flops_vs_scratch']:.3f} "
            f"| {s['final_val_loss']:.4f} | {'' if arm == 'scratch' else f'{delta:+.4f}'} | {s['wall_s']:.0f} |"
        )
    lines += [
        "",
        "Growth (validation loss on the rows every run evaluates on, eval mode, right before and after `dstk grow`):",
        "",
    ]
    lines += ["| arm | parent | grown | abs diff |", "|---|---|---|---|"]
    for arm, s in summary.items():
        if "growth" in s:
            g = s["growth"]
            lines.append(f"| {arm} | {g['parent_loss']:.6f} | {g['grown_loss']:.6f} | {g['abs_diff']:.2e} |")
    lines += ["", f"Models: {json.dumps(settings['models'])}", "", f"Chart: `{paths['png'].name}`", "",
              "Environment (`dstk env`):", "", "```", json.dumps(env["env"], indent=2, sort_keys=True), "```"]  # fmt: skip
    paths["md"].write_text("\n".join(lines) + "\n")
    plot(rows, summary, paths["png"])
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny models, 60 steps: under 3 minutes on 2 cores"
    )
    parser.add_argument("--steps", type=int, help="steps of the from-scratch run (the compute budget)")
    parser.add_argument("--small-fraction", type=float, default=0.5, help="share of the compute spent small")
    parser.add_argument("--out-dir", type=Path, help="where to write (default benchmarks/results)")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep the runs here; a rerun skips finished stages (default: a temporary dir)",
    )
    args = parser.parse_args()
    s = dict(QUICK if args.quick else FULL)
    if args.steps:
        s["steps"] = args.steps
    if not 0 < args.small_fraction < 1:
        parser.error("--small-fraction must be in (0, 1)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    if args.work_dir:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        results = run_arms(s, args, args.work_dir.resolve())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = run_arms(s, args, Path(tmp))
    rows = [row for arm, r in results.items() for row in rows_of(arm, r)]
    summary = summarise(results)
    settings = {**s, "small_fraction": args.small_fraction, "world_size": 2,
                "models": {arm: [st["model"] + f" ({st['n_params']:,} params)" for st in r["stages"]] for arm, r in results.items()}}  # fmt: skip
    paths = write_outputs(rows, summary, settings, args)
    for arm, x in summary.items():
        print(
            f"{arm:8s} val loss {x['final_val_loss']:.4f}  compute ×{x['flops_vs_scratch']:.3f}  {x['wall_s']:.0f} s"
        )
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
