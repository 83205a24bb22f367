"""dstk's cost model against published training runs (no fitting: a report, not a target).

Each row is a run whose layout and throughput are published; we run `dstk estimate` with that layout and
print prediction, publication and their ratio. Sources are cited per row; "hw" rows report TFLOP/s including
recomputation (Megatron's convention), "model" rows model TFLOP/s, "mfu" rows MFU, "tok" tokens/s per GPU.
Each row states the runtime it describes: Megatron-era stacks with `--fused-kernels` (and `--flash-attention`
where they used FlashAttention or xformers), HF transformers models without (eager RMSNorm and rotary, SDPA).
Usage: python benchmarks/published_runs.py
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import result_path, write_json
from benchmarks.published_hopper import HOPPER_MODELS, HOPPER_RUNS, PUBLISHED_MEMORY_GIB

# Narayanan et al. 2021, Table 1 (weak scaling): (billions, heads, hidden, layers, t, p, GPUs, batch, TFLOP/s
# per GPU with recomputation); GPT, vocabulary 51,200, sequence 2048, fp16, Megatron's fused kernels and
# CoreAttention (no FlashAttention in 2021), full recomputation. The table gives no micro-batch: dstk's default 1.
NARAYANAN_TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
# Table 2: ZeRO-3 without model parallelism against PTD-P (t = 8, p = model-parallel size / 8), the same
# models: (billions, scheme, model-parallel size, GPUs, batch, micro-batch, TFLOP/s per GPU)
NARAYANAN_TABLE_2 = [
    (174.6, "zero3", 1, 384, 1536, 4, 144),
    (174.6, "zero3", 1, 768, 1536, 2, 88),
    (174.6, "zero3", 1, 1536, 1536, 1, 44),
    (529.6, "zero3", 1, 640, 2560, 4, 138),
    (529.6, "zero3", 1, 1120, 2240, 2, 98),
    (529.6, "zero3", 1, 2240, 2240, 1, 48),
    (174.6, "ptdp", 96, 384, 1536, 1, 153),
    (174.6, "ptdp", 96, 768, 1536, 1, 149),
    (174.6, "ptdp", 96, 1536, 1536, 1, 141),
    (529.6, "ptdp", 280, 560, 2240, 1, 171),
    (529.6, "ptdp", 280, 1120, 2240, 1, 167),
    (529.6, "ptdp", 280, 2240, 2240, 1, 159),
]
# shapes of the models the two tables train: Table 1's, and GPT-3's for 174.6B
NARAYANAN_SHAPES = [(b, heads, hidden, layers) for b, heads, hidden, layers, *_ in NARAYANAN_TABLE_1]
NARAYANAN_SHAPES.append((174.6, 96, 12288, 96))
MODEL_DIR = "{models}"  # replaced by a temporary folder holding the shapes above as dstk model files


def _narayanan_model(billions: float, heads: int, hidden: int, layers: int) -> dict:
    return {
        "name": f"megatron-{billions:g}b",
        "architecture": "gpt2",
        "activation": "gelu",
        "n_layers": layers,
        "hidden_size": hidden,
        "n_heads": heads,
        "vocab_size": 51200,
        "seq_length": 2048,
        "max_position_embeddings": 2048,
    }


RUNS = [
    # (label, source, dstk estimate args, metric, published value)
    *(
        (
            f"Megatron {b:g}B, TP{t} PP{p}, {n} A100",
            "Narayanan et al. 2021, Table 1",
            f"--model {MODEL_DIR}/megatron-{b:g}b.yaml --cluster dgx-a100-80g --nodes {n // 8} --tp {t} --pp {p} "
            f"--global-batch {batch} --recompute full --precision fp16 --fused-kernels"
            + (" --tp-vocab-parallel" if t > 1 else ""),
            "hw",
            published,
        )
        for b, _, _, _, t, p, n, batch, published in NARAYANAN_TABLE_1
    ),
    *(
        (
            f"Megatron {b:g}B, {'ZeRO-3' if scheme == 'zero3' else 'PTD-P TP8 PP' + str(mp // 8)}, {n} A100, b={micro}",
            "Narayanan et al. 2021, Table 2",
            f"--model {MODEL_DIR}/megatron-{b:g}b.yaml --cluster dgx-a100-80g --nodes {n // 8} "
            + ("--zero-stage 3" if scheme == "zero3" else f"--tp 8 --pp {mp // 8} --tp-vocab-parallel")
            + f" --micro-batch {micro} --global-batch {batch} --recompute full --precision fp16 --fused-kernels",
            "hw",
            published,
        )
        for b, scheme, mp, n, batch, micro, published in NARAYANAN_TABLE_2
    ),
    (
        "175B, TP8 PP8 SP + selective, 64 A100",
        "Korthikanti et al. 2022, Table 5",
        "--model gpt3-175b --cluster dgx-a100-80g --nodes 8 --tp 8 --pp 8 --global-batch 64 --recompute selective --tp-sequence-parallel --tp-vocab-parallel --fused-kernels",
        "mfu",
        0.514,
    ),
    (
        "1T, TP8 PP64 SP + selective, 512 A100",
        "Korthikanti et al. 2022, Table 5",
        "--model gpt-1t --cluster dgx-a100-80g --nodes 64 --tp 8 --pp 64 --global-batch 512 --recompute selective --tp-sequence-parallel --tp-vocab-parallel --fused-kernels",
        "mfu",
        0.563,
    ),
    (
        "MT-NLG 530B, TP8 PP35 ZeRO-1, 2240 A100",
        "Smith et al. 2022, §2.4",
        "--model mt-nlg-530b --cluster dgx-a100-80g --nodes 280 --tp 8 --pp 35 --zero-stage 1 --global-batch 1920 --recompute full --tp-vocab-parallel --fused-kernels",
        "hw",
        126,
    ),
    (
        "MT-NLG 530B, TP8 PP35 ZeRO-1, 3360 A100",
        "Smith et al. 2022, §2.4",
        "--model mt-nlg-530b --cluster dgx-a100-80g --nodes 420 --tp 8 --pp 35 --zero-stage 1 --global-batch 1920 --recompute full --tp-vocab-parallel --fused-kernels",
        "hw",
        113,
    ),
    (
        "BLOOM 176B, TP4 PP12 ZeRO-1, 384 A100",
        "BigScience 2022 (model card: ~150 TFLOP/s)",
        "--model bloom-176b --cluster dgx-a100-80g --nodes 48 --inter-node-gb-per-s 6.25 --tp 4 --pp 12 --zero-stage 1 --micro-batch 2 --global-batch 2048 --recompute full --tp-vocab-parallel --fused-kernels",
        "hw",
        150,
    ),
    (
        "OPT-175B, FSDP + TP8, 992 A100",
        "Zhang et al. 2022, §2.3 (147 TFLOP/s)",
        "--model gpt3-175b --cluster dgx-a100-80g --nodes 124 --tp 8 --zero-stage 3 --micro-batch 8 --global-batch 992 --recompute full --precision fp16 --tp-vocab-parallel --fused-kernels",
        "hw",
        147,
    ),
    (
        "LLaMA 65B, 2048 A100 (tokens/s/GPU)",
        "Touvron et al. 2023, §2.4 (380 tokens/s/GPU)",
        "--model llama-65b --cluster dgx-a100-80g --nodes 256 --tp 8 --zero-stage 1 --global-batch 2048 --recompute selective --tp-sequence-parallel --tp-vocab-parallel --fused-kernels --flash-attention",
        "tok",
        380,
    ),
    # HF transformers models (eager RMSNorm/rotary, SDPA or FlashAttention-2 attention), the target `dstk train`
    # runs. FSDP full sharding is priced as ZeRO-3 (the same gathers and reduce-scatters). These runs predate
    # transformers 5: HF Trainer's gradient checkpointing was reentrant (use_reentrant=True unless
    # gradient_checkpointing_kwargs said otherwise), which recomputes whole blocks: --no-recompute-early-stop.
    *(
        (
            f"HF Mistral-7B{' + fused kernels' if fused else ''}, FSDP, ckpt, 2 A100, b={b}",
            f"IBM fms-acceleration, scripts/benchmarks/refs/a100_80gb.csv @24bdadb ({tps} tok/s/GPU"
            + (": unsloth's fused RMSNorm, RoPE and loss" if fused else "")
            + "; FA2, seq 4096 packed, pure bf16)",
            f"--model mistral-7b --cluster dgx-a100-80g --gpus-per-node 2 --zero-stage 3 --micro-batch {b} "
            f"--global-batch {2 * b} --recompute full --no-recompute-early-stop --seq-length 4096"
            + (" --fused-kernels --flash-attention" if fused else ""),
            "tok",
            tps,
        )
        for b, fused, tps in (
            (2, False, 2777.18),
            (4, False, 3008.934),
            (2, True, 3094.813),
            (4, True, 3373.217),
        )
    ),
    (
        "HF Granite-7B (Llama-2 shape), DeepSpeed ZeRO-3, 4 A100, b=8",
        "HF blog 'From DeepSpeed to FSDP and Back Again', Table 3 (3094.5 tok/s/device; seq 4096 from its 10.6 s "
        "step, checkpointing because 8 sequences would not fit without)",
        "--model llama-7b --cluster dgx-a100-80g --gpus-per-node 4 --zero-stage 3 --micro-batch 8 --global-batch 32 "
        "--recompute full --no-recompute-early-stop --seq-length 4096",
        "tok",
        3094.5,
    ),
    # unit unstated: 'Th.put' read as samples/s of the 8-GPU job (the only reading under 100 % MFU that offload and
    # checkpointing lower); A800 NVLink 400 GB/s, two thirds of the A100's
    *(
        (
            f"HF LLaMA-7B, DeepSpeed ZeRO-{z}, {'ckpt, ' if ckpt else ''}8 A800, b={b}",
            f"chenyaofo gist d4cd6a20 (Th.put {thput}, read as samples/s: {thput * 4096 / 8:.0f} tok/s/GPU)",
            f"--model llama-7b --cluster dgx-a100-80g --intra-node-gb-per-s 155 --zero-stage {z} --micro-batch {b} "
            f"--global-batch 64 --recompute {'full --no-recompute-early-stop' if ckpt else 'none'} --seq-length 4096",
            "tok",
            thput * 4096 / 8,
        )
        for z, ckpt, b, thput in ((2, False, 1, 5.33), (3, True, 8, 4.73))
    ),
]
METRIC = {"hw": "hardware_tflops_per_gpu", "model": "tflops_per_gpu", "mfu": "mfu"}


def group_of(label: str) -> str:
    """The report's groups for the A100-era rows (the Hopper rows carry theirs)."""
    if "ZeRO-3" in label and label.startswith("Megatron"):
        return "A100, DeepSpeed ZeRO-3 (2021)"
    if label.startswith("HF "):
        return "A100, HF models"
    return "A100, Megatron-era"


def summary(rows: list[dict]) -> list[str]:
    """Per group: runs, median |ratio − 1|, the worst, and the range of ratios."""
    out = []
    groups = {g: [r for r in rows if r["group"] == g] for g in dict.fromkeys(r["group"] for r in rows)}
    for precision in ("bf16", "fp8"):  # the acceptance bands: every Hopper row of a precision together
        together = [r for r in rows if r["group"].startswith("Hopper") and r["group"].endswith(precision)]
        if len({r["group"] for r in together}) > 1:
            groups[f"Hopper, all {precision} rows"] = together
    for group, members in groups.items():
        out.append(error_line(group, [r["ratio"] for r in members]))
    return out


def error_line(group: str, ratios: list[float]) -> str:
    """One group's line of a summary: runs, median |ratio − 1|, the worst, and the range of ratios."""
    import statistics

    errs = [abs(x - 1) for x in ratios]
    return (
        f"{group}: {len(ratios)} runs, median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}, "
        f"ratios ×{min(ratios):.2f}–{max(ratios):.2f}"
    )


def memory_summary(rows: list[dict]) -> list[str]:
    """dstk's memory per GPU against what the reports that give it measured (PUBLISHED_MEMORY_GIB: the
    allocator's reserved peak, at least what was live), by GPU."""
    out = []
    for gpu in ("H100", "H200"):
        ratios = [r["memory_ratio"] for r in rows if "memory_ratio" in r and r["run"].endswith(gpu)]
        if ratios:
            out.append(
                f"torchtitan memory on {gpu}, dstk / reported reserved peak: {len(ratios)} runs, "
                f"×{min(ratios):.2f}–{max(ratios):.2f}"
            )
    return out


def estimate_json(flags: list[str], context: object = None) -> dict:
    """`dstk estimate FLAGS --json` run in this process (no start-up per row), parsed; `context` names the
    row when the estimate refuses it."""
    import contextlib
    import io

    from toolkit.cli import main as dstk

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = dstk(["estimate", *flags, "--json"])
    assert code == 0, (context, code)
    return json.loads(out.getvalue())


def write_report(
    bench: str,
    rows: list[dict],
    heading: str,
    columns: list[str],
    cells: Callable[[dict], list[str]],
    summarize: Callable[[list[dict]], list[str]] | None = None,
) -> None:
    """Print the groups' summary (`summarize`, default `summary`), then write the rows to results as JSON and as
    a Markdown table (`heading`, the summary, one line of `cells(row)` per row under `columns`)."""
    groups = (summarize or summary)(rows)
    print("\n".join(groups))
    write_json(bench, {"rows": rows, "groups": groups})
    md = result_path(bench, "md")
    md.write_text(
        f"{heading}\n\n"
        + "".join(f"- {g}\n" for g in groups)
        + "\n| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|\n"
        + "".join("| " + " | ".join(cells(r)) + " |\n" for r in rows)
    )  # fmt: skip
    print(f"wrote {md}")


def main() -> int:
    import tempfile

    import yaml

    rows = []
    models = Path(tempfile.mkdtemp(prefix="dstk-published-"))
    for b, heads, hidden, layers in NARAYANAN_SHAPES:
        spec = _narayanan_model(b, heads, hidden, layers)
        (models / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))
    for name, spec in HOPPER_MODELS.items():
        (models / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **spec}))
    runs = [(*r, group_of(r[0])) for r in RUNS] + list(HOPPER_RUNS)
    for label, source, args, metric, published, group in runs:
        est = estimate_json(args.replace(MODEL_DIR, str(models)).split(), label)
        value = est["tokens_per_s"] / est["layout"]["world_size"] if metric == "tok" else est[METRIC[metric]]
        rows.append(
            {
                "run": label,
                "group": group,
                "source": source,
                "args": args,
                "metric": metric,
                "published": published,
                "predicted": value,
                "ratio": value / published,
                "fits": est["fits"],
                "memory_gib": est["memory_per_gpu_bytes"]["total"] / 2**30,
            }
        )
        if label in PUBLISHED_MEMORY_GIB:
            rows[-1]["published_memory_gib"] = PUBLISHED_MEMORY_GIB[label]
            rows[-1]["memory_ratio"] = rows[-1]["memory_gib"] / PUBLISHED_MEMORY_GIB[label]
        print(
            f"{value / published:5.2f}  {value:9.3f} vs {published:8.3f} {metric:5s} fits={est['fits']!s:5s} {label}"
        )
    memory = memory_summary(rows)
    print("\n".join(memory))
    write_report(
        "published_runs",
        rows,
        "# dstk estimate vs published training runs\n\nCommand: `python benchmarks/published_runs.py`. "
        "Metric: hw = TFLOP/s per GPU with recomputation, model = without, mfu, tok = tokens/s per GPU. "
        "Memory: dstk's GiB per GPU, and the reserved peak where the report gives it.\n\n"
        + "".join(f"- {line}\n" for line in memory),
        ["run", "source", "metric", "published", "dstk", "ratio", "fits", "dstk GiB", "reported GiB"],
        lambda r: [
            r["run"],
            r["source"],
            r["metric"],
            f"{r['published']:g}",
            f"{r['predicted']:.4g}",
            f"{r['ratio']:.2f}",
            str(r["fits"]),
            f"{r['memory_gib']:.1f}",
            f"{r['published_memory_gib']:g}" if "published_memory_gib" in r else "",
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
