"""dstk's cost model against published large-scale training runs (no fitting: a report, not a target).

Each row is a run whose layout and throughput are published; we run `dstk estimate` with that layout and
print prediction, publication and their ratio. Sources are cited per row; "hw" rows report TFLOP/s including
recomputation (Megatron's convention), "model" rows model TFLOP/s, "mfu" rows MFU, "tok" tokens/s per GPU.
Usage: python benchmarks/published_runs.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import result_path, write_json

RUNS = [
    # (label, source, dstk estimate args, metric, published value)
    (
        "Megatron 145.6B, TP8 PP8, 1536 A100",
        "Narayanan et al. 2021, Table 1",
        "--params 145.6e9 --cluster dgx-a100-80g --nodes 192 --tp 8 --pp 8 --global-batch 2304 --recompute full --precision fp16 --tp-vocab-parallel",
        "hw",
        148,
    ),
    (
        "Megatron 1T, TP8 PP64, 3072 A100",
        "Narayanan et al. 2021, Table 1",
        "--model gpt-1t --cluster dgx-a100-80g --nodes 384 --tp 8 --pp 64 --global-batch 3072 --recompute full --precision fp16 --tp-vocab-parallel",
        "hw",
        163,
    ),
    (
        "Megatron 39.1B, TP8 PP2, 512 A100",
        "Narayanan et al. 2021, Table 1",
        "--params 39.1e9 --cluster dgx-a100-80g --nodes 64 --tp 8 --pp 2 --global-batch 1536 --recompute full --precision fp16 --tp-vocab-parallel",
        "hw",
        138,
    ),
    (
        "Megatron 1.7B, DP only, 32 A100",
        "Narayanan et al. 2021, Table 1",
        "--params 1.7e9 --cluster dgx-a100-80g --nodes 4 --global-batch 512 --recompute full --precision fp16",
        "hw",
        137,
    ),
    (
        "GPT-3 175B ZeRO-3, 384 A100, b=4",
        "Narayanan et al. 2021, Table 2",
        "--model gpt3-175b --cluster dgx-a100-80g --nodes 48 --zero-stage 3 --micro-batch 4 --global-batch 1536 --recompute full",
        "hw",
        144,
    ),
    (
        "GPT-3 175B ZeRO-3, 768 A100, b=2",
        "Narayanan et al. 2021, Table 2",
        "--model gpt3-175b --cluster dgx-a100-80g --nodes 96 --zero-stage 3 --micro-batch 2 --global-batch 1536 --recompute full",
        "hw",
        88,
    ),
    (
        "GPT-3 175B ZeRO-3, 1536 A100, b=1",
        "Narayanan et al. 2021, Table 2",
        "--model gpt3-175b --cluster dgx-a100-80g --nodes 192 --zero-stage 3 --micro-batch 1 --global-batch 1536 --recompute full",
        "hw",
        44,
    ),
    (
        "175B, TP8 PP8 SP + selective, 64 A100",
        "Korthikanti et al. 2022, Table 5",
        "--model gpt3-175b --cluster dgx-a100-80g --nodes 8 --tp 8 --pp 8 --global-batch 64 --recompute selective --tp-sequence-parallel --tp-vocab-parallel",
        "mfu",
        0.514,
    ),
    (
        "1T, TP8 PP64 SP + selective, 512 A100",
        "Korthikanti et al. 2022, Table 5",
        "--model gpt-1t --cluster dgx-a100-80g --nodes 64 --tp 8 --pp 64 --global-batch 512 --recompute selective --tp-sequence-parallel --tp-vocab-parallel",
        "mfu",
        0.563,
    ),
    (
        "MT-NLG 530B, TP8 PP35 ZeRO-1, 2240 A100",
        "Smith et al. 2022, §2.4",
        "--model mt-nlg-530b --cluster dgx-a100-80g --nodes 280 --tp 8 --pp 35 --zero-stage 1 --global-batch 1920 --recompute full --tp-vocab-parallel",
        "hw",
        126,
    ),
    (
        "MT-NLG 530B, TP8 PP35 ZeRO-1, 3360 A100",
        "Smith et al. 2022, §2.4",
        "--model mt-nlg-530b --cluster dgx-a100-80g --nodes 420 --tp 8 --pp 35 --zero-stage 1 --global-batch 1920 --recompute full --tp-vocab-parallel",
        "hw",
        113,
    ),
    (
        "BLOOM 176B, TP4 PP12 ZeRO-1, 384 A100",
        "BigScience 2022 (model card: ~150 TFLOP/s)",
        "--model bloom-176b --cluster dgx-a100-80g --nodes 48 --inter-node-gb-per-s 6.25 --tp 4 --pp 12 --zero-stage 1 --micro-batch 2 --global-batch 2048 --recompute full --tp-vocab-parallel",
        "hw",
        150,
    ),
    (
        "OPT-175B, FSDP + TP8, 992 A100",
        "Zhang et al. 2022, §2.3 (147 TFLOP/s)",
        "--model gpt3-175b --cluster dgx-a100-80g --nodes 124 --tp 8 --zero-stage 3 --micro-batch 8 --global-batch 992 --recompute full --precision fp16 --tp-vocab-parallel",
        "hw",
        147,
    ),
    (
        "LLaMA 65B, 2048 A100 (tokens/s/GPU)",
        "Touvron et al. 2023, §2.4 (380 tokens/s/GPU)",
        "--model llama-65b --cluster dgx-a100-80g --nodes 256 --tp 8 --zero-stage 1 --global-batch 2048 --recompute selective --tp-sequence-parallel --tp-vocab-parallel --fused-kernels",
        "tok",
        380,
    ),
    (
        "Llama 3 405B, TP8 PP16, 8192 H100",
        "Dubey et al. 2024, Table 4 (430 TFLOP/s)",
        "--model llama3-405b --cluster dgx-h100 --nodes 1024 --tp 8 --pp 16 --zero-stage 1 --global-batch 2048 --recompute selective --tp-sequence-parallel --tp-vocab-parallel --fused-kernels",
        "model",
        430,
    ),
]
METRIC = {"hw": "hardware_tflops_per_gpu", "model": "tflops_per_gpu", "mfu": "mfu"}


def main() -> int:
    import contextlib
    import io

    from toolkit.cli import main as dstk

    rows = []
    for label, source, args, metric, published in RUNS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = dstk(["estimate", *args.split(), "--json"])
        assert code == 0, (label, code)
        est = json.loads(out.getvalue())
        value = est["tokens_per_s"] / est["layout"]["world_size"] if metric == "tok" else est[METRIC[metric]]
        rows.append(
            {
                "run": label,
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
        print(
            f"{value / published:5.2f}  {value:9.3f} vs {published:8.3f} {metric:5s} fits={est['fits']!s:5s} {label}"
        )
    write_json("published_runs", {"rows": rows})
    md = result_path("published_runs", "md")
    md.write_text(
        "# dstk estimate vs published training runs\n\nCommand: `python benchmarks/published_runs.py`. "
        "Metric: hw = TFLOP/s per GPU with recomputation, model = without, mfu, tok = tokens/s per GPU.\n\n"
        "| run | source | metric | published | dstk | ratio | fits |\n|---|---|---|---|---|---|---|\n"
        + "".join(
            f"| {r['run']} | {r['source']} | {r['metric']} | {r['published']:g} | {r['predicted']:.3g} | "
            f"{r['ratio']:.2f} | {r['fits']} |\n"
            for r in rows
        )
    )
    print(f"wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
