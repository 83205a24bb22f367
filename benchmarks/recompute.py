"""What full recomputation costs, measured beside what the cost model charges for it: none, full with PyTorch's
early stop (the down projection not replayed), and full replaying whole blocks, side by side in one run.

One process, one HF Llama built from a dstk model description, forward + backward per step (no optimizer:
recomputation lives in backward), checkpointed exactly as `dstk train` does it (toolkit.run.session.
_recompute_blocks, for the layout each mode prices). The modes run round-robin, one step each per round, so a
noisy machine slows all three alike; the figures are medians. Beside each mode's measured time relative to no
recomputation stands `dstk estimate`'s compute time for the same layout relative to its own: the ratios, not
the seconds, are what a planner weighs when it trades memory for recomputation. On the CPU the prediction uses
the `cpu` preset (calibrated on this machine kind); on a GPU, `local`'s GPU table figures.

Usage: python benchmarks/recompute.py [--layers N] [--hidden H] [--micro-batch B] [--seq S] [--rounds N]
                                      [--precision fp32|bf16] [--tiny] [--out-dir DIR]
Writes Markdown and JSON to benchmarks/results/ (or --out-dir).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import command_line, output_paths, write_record

MODES = {"none": ("none", None), "full, early stop": ("full", True), "full, whole blocks": ("full", False)}


def _spec(args: argparse.Namespace) -> Any:
    from toolkit.plan.specs import ModelSpec

    return ModelSpec(
        name=f"llama-h{args.hidden}-l{args.layers}",
        architecture="llama",
        n_layers=args.layers,
        hidden_size=args.hidden,
        n_heads=args.hidden // 64,
        ffn_hidden_size=int(args.hidden * 8 / 3) // 64 * 64,
        vocab_size=args.vocab,
        seq_length=args.seq,
    )


def predicted_compute_s(spec: Any, cluster_name: str, mode: str, micro: int, precision: str) -> float:
    """`dstk estimate`'s compute seconds per step for the mode's layout (ZeRO-1: dstk train's recomputation
    path at stage < 3 is torch's checkpoint with or without early stop)."""
    from toolkit.plan.cost.estimate import estimate
    from toolkit.plan.layout import LayoutRequest
    from toolkit.plan.load import load_cluster
    from toolkit.plan.rules import resolve_layout

    recompute, early = MODES[mode]
    cluster = load_cluster(cluster_name)
    request = LayoutRequest(
        zero_stage=1,
        micro_batch_size=micro,
        gradient_accumulation_steps=1,
        recompute=recompute,
        recompute_early_stop=early,
        precision=precision,
    )
    return estimate(spec, cluster, resolve_layout(spec, cluster, request)).time.compute_s


def measure(spec: Any, args: argparse.Namespace, device: str) -> dict[str, list[float]]:
    """Seconds of forward + backward per step for every mode, `args.rounds` rounds after one warm-up round."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit.plan.layout import Layout
    from toolkit.run.models import hf_config
    from toolkit.run.session import _recompute_blocks

    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    models = {}
    for mode, (recompute, early) in MODES.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=dtype).to(device)
        model.train()
        if recompute == "full":
            layout = Layout(
                precision=args.precision, dp=1, global_batch_size=1, gradient_accumulation_steps=1,
                world_size=1, recompute="full", recompute_early_stop=early,
            )  # fmt: skip
            _recompute_blocks(model, layout)
        models[mode] = model
    ids = torch.randint(0, spec.vocab_size, (args.micro_batch, spec.seq_length), device=device)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds + 1):
        for mode, model in models.items():
            model.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            if device == "cuda":
                torch.cuda.synchronize()
            if round_:  # the first round warms the allocator and the kernels
                times[mode].append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default=None, help="default: bf16 on a GPU, else fp32"
    )
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 128-wide model for a smoke run")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.tiny:
        args.layers, args.hidden, args.vocab, args.seq = 2, 128, 512, 128
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.precision = args.precision or ("bf16" if device == "cuda" else "fp32")
    cluster = "local" if device == "cuda" else "cpu"
    spec = _spec(args)
    times = measure(spec, args, device)
    medians = {mode: statistics.median(t) for mode, t in times.items()}
    predicted = {m: predicted_compute_s(spec, cluster, m, args.micro_batch, args.precision) for m in MODES}
    rows = [
        {
            "mode": mode,
            "measured_s": medians[mode],
            "measured_vs_none": medians[mode] / medians["none"],
            "predicted_s": predicted[mode],
            "predicted_vs_none": predicted[mode] / predicted["none"],
        }
        for mode in MODES
    ]
    whole, early = medians["full, whole blocks"], medians["full, early stop"]
    p_whole, p_early = predicted["full, whole blocks"], predicted["full, early stop"]
    saving = {"measured": (whole - early) / whole, "predicted": (p_whole - p_early) / p_whole}
    paths = output_paths("recompute", args.out_dir)
    record = {
        "device": device,
        "precision": args.precision,
        "cluster_for_prediction": cluster,
        "model": spec.model_dump(exclude_none=True),
        "micro_batch": args.micro_batch,
        "rounds": args.rounds,
        "step_times_s": times,
        "rows": rows,
        "early_stop_saving": saving,
    }
    write_record(paths["json"], record)
    lines = [
        f"# Recomputation, measured beside dstk's price ({device}, {args.precision})",
        "",
        f"`{command_line()}` — {spec.name}: {spec.n_layers} Llama blocks of {spec.hidden_size} "
        f"(MLP {spec.ffn_hidden_size}), {args.micro_batch} × {spec.seq_length} tokens, forward + backward, "
        f"median of {args.rounds} round-robin rounds; prediction: `dstk estimate` compute time, cluster "
        f"`{cluster}`.",
        "",
        "| recomputation | measured s | measured ÷ none | predicted s | predicted ÷ none |",
        "|---|---|---|---|---|",
        *(
            f"| {r['mode']} | {r['measured_s']:.3f} | {r['measured_vs_none']:.3f} | {r['predicted_s']:.3f} | "
            f"{r['predicted_vs_none']:.3f} |"
            for r in rows
        ),
        "",
        f"Early stop saves {saving['measured']:.1%} of whole-block recomputation's step measured, "
        f"{saving['predicted']:.1%} predicted.",
        "",
        "Compare the ratios, not the seconds: the prediction prices one rank of the cluster it names (on the CPU, "
        "the `cpu` preset's rank, calibrated with two ranks sharing the machine), the measurement is one process "
        "with every core.",
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
