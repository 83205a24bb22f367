"""dstk's cost model against every row of MosaicML llm-foundry's H100 bf16 tables (a report, not a target).

`benchmarks/data/llm_foundry_h100_bf16.md` holds the two tables verbatim (70 runs of MPT 760M-70B, 8-512 H100,
sequence 512-65,536, PyTorch FSDP1 under composer). Each row is priced with the layout it states (sharding
strategy as ZeRO-2/3 under `--fsdp`, micro-batch, accumulation, activation checkpointing as full
recomputation through PyTorch's non-reentrant checkpoint — the yamls' `activation_checkpointing_reentrant:
false`, which stops before each block's down projection (`--fsdp`'s default early stop) — composer's
`DEFAULT` mixed precision reducing in fp32) and with what its sweep passed:
- the large-scale table (128-512 GPUs; sweep.py @5e85bd62d) sets BACKWARD_PRE and forward prefetch;
- the other (8-64 GPUs; sweep.sh @b2a43a147) passes no prefetch flag, so composer's default BACKWARD_POST
  applies (`--fsdp-backward-prefetch post`).
Both price attention as FlashAttention-2 at the preset's efficiency, although the older sweep (and the 13B and
30B large-scale runs) ran MPT's Triton flash attention, for which no Hopper figure is published.

The report splits the runs by table and by activation checkpointing, because that is where dstk's error
lives: checkpointed runs ×1.03-1.12 optimistic, runs without checkpointing ×1.1-1.3 (docs/cost-model.md).
Each row also carries dstk's memory per GPU as a share of the GPU's, against which that gap does not line up.
Nothing here is fitted; these rows are not in benchmarks/published_runs.py's groups but for nine.
Usage: python benchmarks/published_foundry.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.published_runs import estimate_json, write_report

TABLES = Path(__file__).resolve().parent / "data" / "llm_foundry_h100_bf16.md"
# MPT shapes (n_layers, d_model, n_heads) from llm-foundry's scripts/train/yamls/pretrain/mpt-*.yaml; vocabulary
# 50,368, learned positions, biases, no dropout (MPTConfig's defaults), exact GeLU, 4× MLP
SHAPES = {
    "760m": (24, 1536, 12),
    "1b": (24, 2048, 16),
    "3b": (32, 2560, 32),
    "7b": (32, 4096, 32),
    "13b": (40, 5120, 40),
    "30b": (48, 7168, 56),
    "70b": (80, 8192, 64),
}
LARGE = "Large Scale"


def read_tables(path: Path = TABLES) -> list[dict]:
    """The tables' rows, each with the table it came from (its sweep's settings)."""
    rows, table = [], ""
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            table = line[3:]
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 20 or not cells[2].isdigit():
            continue
        rows.append(
            {
                "table": table,
                "model": cells[0],
                "seq": int(cells[1]),
                "gpus": int(cells[2]),
                "micro_batch": int(cells[7]),
                "accum": int(cells[8]),
                "global_batch": int(cells[9]),
                "tokens_per_s_per_gpu": float(cells[12]),
                "mixed_precision": cells[15],
                "sharding": cells[16],
                "checkpointing": cells[17] == "True",
                "n_params": int(cells[19]),
            }
        )
    return rows


def model_spec(row: dict) -> dict:
    layers, hidden, heads = SHAPES[row["model"]]
    return {
        "name": f"mpt-{row['model']}",
        "architecture": "gpt2",
        "n_layers": layers,
        "hidden_size": hidden,
        "n_heads": heads,
        "vocab_size": 50368,
        "seq_length": row["seq"],
        "max_position_embeddings": row["seq"],
        "position_embedding": "learned",
        "activation": "gelu",
        "dropout": False,
    }


def estimate_args(row: dict, model_path: Path) -> list[str]:
    """`dstk estimate` flags for the row as its sweep ran it (estimate_json adds `--json`)."""
    args = [
        "--model", str(model_path), "--cluster", "dgx-h100", "--nodes", str(max(1, row["gpus"] // 8)),
        "--zero-stage", "3" if row["sharding"] == "FULL_SHARD" else "2",
        "--micro-batch", str(row["micro_batch"]), "--global-batch", str(row["global_batch"]),
        "--recompute", "full" if row["checkpointing"] else "none", "--flash-attention",
        "--fsdp", "bf16" if row["mixed_precision"] == "PURE" else "fp32",
    ]  # fmt: skip
    if row["gpus"] < 8:
        args += ["--gpus-per-node", str(row["gpus"])]
    if LARGE not in row["table"]:
        args += ["--fsdp-backward-prefetch", "post"]
    return args


def group_of(row: dict) -> str:
    table = "128-512 GPUs (Jan 2024)" if LARGE in row["table"] else "8-64 GPUs (Oct 2023)"
    return f"llm-foundry H100 bf16, {table}, {'checkpointed' if row['checkpointing'] else 'no checkpointing'}"


def price(rows: list[dict], models: Path) -> list[dict]:
    import yaml

    priced = []
    for row in rows:
        path = models / f"mpt-{row['model']}-{row['seq']}.yaml"
        path.write_text(yaml.safe_dump(model_spec(row)))
        est = estimate_json(estimate_args(row, path), row)
        predicted = est["tokens_per_s"] / est["layout"]["world_size"]
        priced.append(
            {
                **row,
                "group": group_of(row),
                "predicted": predicted,
                "ratio": predicted / row["tokens_per_s_per_gpu"],
                "fits": est["fits"],
                "dstk_params": est["n_params"],
                "memory_share": est["memory_per_gpu_bytes"]["total"] / est["gpu_memory_bytes"],
            }
        )
    return priced


def main() -> int:
    import tempfile

    rows = price(read_tables(), Path(tempfile.mkdtemp(prefix="dstk-foundry-")))
    for r in rows:
        print(
            f"{r['ratio']:5.2f}  {r['predicted']:9.0f} vs {r['tokens_per_s_per_gpu']:7.0f} tok/s/GPU  "
            f"MPT-{r['model']} seq {r['seq']} on {r['gpus']}, b={r['micro_batch']}×{r['accum']} "
            f"{r['sharding']} ckpt={r['checkpointing']} fits={r['fits']}"
        )
    write_report(
        "published_foundry",
        rows,
        "# dstk estimate vs llm-foundry's H100 bf16 tables\n\nCommand: `python benchmarks/published_foundry.py`. "
        "Ratio = dstk / published tokens/s per GPU.",
        [
            "model",
            "seq",
            "GPUs",
            "micro × accum",
            "sharding",
            "ckpt",
            "published",
            "dstk",
            "ratio",
            "fits",
            "memory",
        ],
        lambda r: [
            f"MPT-{r['model']}",
            str(r["seq"]),
            str(r["gpus"]),
            f"{r['micro_batch']} × {r['accum']}",
            r["sharding"],
            str(r["checkpointing"]),
            f"{r['tokens_per_s_per_gpu']:g}",
            f"{r['predicted']:.0f}",
            f"{r['ratio']:.2f}",
            str(r["fits"]),
            f"{r['memory_share']:.0%}",
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
