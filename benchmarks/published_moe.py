"""dstk's cost model against published Mixture-of-Experts training runs (no fitting: a report, not a target).

The rows (benchmarks/data/published_moe.yaml, each with its source, commit, table, layout and measured tokens/s
per GPU) come from NVIDIA Megatron-Bridge's performance summaries (docs/performance-summary*.md @ 4ab94df), the
NeMo Framework performance pages and torchtitan's published MoE results (the DeepEP PR's README @ efd87e4, the
torchao MoE-training README @ 0b1bb11). Rows dstk cannot price as published are listed under `left_out` with the
reason (Mamba hybrids, DeepSeek-V4's sparse attention, token-dropping runs whose capacity factor is not given,
layouts the source does not give or contradicts). Other published tables (NeMo AutoModel, the DeepSeek-V3 report,
MoE Parallel Folding) are held out: they were not used to build or check the model.

Each row is priced as its stack runs, from the recipe (no per-row constant):
- Megatron-Core (Megatron-Bridge, NeMo): `--fused-kernels --flash-attention` (TE's fused kernels, cuDNN fused
  attention at `--attention-efficiency 0.55`: the FlashAttention-3 repository's H100 charts, cuDNN ~600/500
  TFLOP/s forward/backward at head dim 128, and the Megatron-Core MoE report's cuDNN figures on Blackwell, 1324/1083
  TFLOP/s at sequence 4096 against a 2250 peak), the distributed optimizer (`--zero-stage 1`) with overlapped
  gradient reduce and parameter gather (`--comm-overlap`), MoE parallel folding (`--etp`, 1 unless the row gives
  it), Megatron's sequence parallelism and vocabulary-parallel embedding with TP, context parallelism as `--sp`,
  the recipe's dispatcher (`--moe-dispatcher`), EP communication overlap (`--ep-comm-overlap`), force-balanced
  routing ("In MoE training benchmarks, we force-balance the token distribution among experts", the summary's
  footnote), the recipe's pipeline layout and multi-token-prediction layers, FP8 with per-tensor current scaling
  (`--precision fp8 --fp8-scaling current`, Bridge's fp8_cs), MXFP8 and NVFP4 as TE's block-scaled recipes,
  the full-iteration CUDA graph of the newest recipes (`--cuda-graphs`), and the recipe's recomputed modules
  (`--recompute-modules`).
- torchtitan: PyTorch FSDP2 (`--fsdp fp32 --zero-stage 3`, gradients reduced in fp32, torchtitan's default),
  torch.compile (`--fused-kernels`), fused attention (`--flash-attention`; the DeepEP rows' Qwen3 runs SDPA,
  whose torchtitan wrapper puts cuDNN's kernel first, torchtitan/models/attention.py @ efd87e4), expert
  parallelism inside the FSDP ranks, DeepEP where the row says so, full activation checkpointing where it was on.
Controlled pairs (`controlled_pairs` in the data) are runs a source measured twice, one recipe switch off and on and
everything else held fixed (Megatron-Bridge's EP-overlap A/B on 16 H100): the summary prints the measured and
dstk's step times for each, which says whether dstk prices what the switch buys. They are held out like the other
tables: not rows, not used to build the model.
Usage: python benchmarks/published_moe.py [--kernel-launch-us US]
`--kernel-launch-us` reprices every row with that host cost per kernel (the cluster presets' 5 µs otherwise): a
sensitivity check of the host-issue floor, printed only, not recorded.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.published_runs import error_line, estimate_json, write_report

DATA = Path(__file__).resolve().parent / "data" / "published_moe.yaml"
PRESETS = Path(__file__).resolve().parents[1] / "toolkit" / "plan" / "presets" / "models"
CLUSTER_PRESETS = PRESETS.parent / "clusters"
CLUSTERS = {
    "GB200": "gb200-nvl72",
    "GB300": "gb300-nvl72",
    "B200": "dgx-b200",
    "B300": "dgx-b300",
    "H100": "dgx-h100",
}
GPUS_PER_NODE = {"gb200-nvl72": 4, "gb300-nvl72": 4, "dgx-b200": 8, "dgx-b300": 8, "dgx-h100": 8}
PRECISION = {"bf16": "bf16", "fp8-current": "fp8", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}
# Mixtral 8x22B (mistralai/Mixtral-8x22B-v0.1 config.json): not a dstk preset
EXTRA_MODELS = {
    "mixtral-8x22b": dict(
        architecture="mixtral",
        n_layers=56,
        hidden_size=6144,
        n_heads=48,
        n_kv_heads=8,
        ffn_hidden_size=16384,
        vocab_size=32000,
        seq_length=4096,
        max_position_embeddings=65536,
        num_experts=8,
        moe_top_k=2,
    )
}
# Megatron-Bridge's DeepSeek-V3 and Kimi K2 layouts by (pp, vp): set_deepseek_v3_pipeline_model_parallel_layout
# (src/megatron/bridge/recipes/deepseek/deepseek_v3.py) and _get_kimi_k2_pipeline_layout (recipes/kimi/kimi_k2.py):
# 16 virtual stages [E+4t] [4t]×14 [t(+m)+L], 8 stages [E+8t] [8t]×6 [5t(+m)+L]; 32 stages are Megatron-LM's
# DeepSeek-V3 guide's `Et|(tt|)*30mL`.
BRIDGE_LAYOUTS = {
    16: "Et*4|(t*4|)*14t{m}L",
    8: "Et*8|(t*8|)*6t*5{m}L",
    4: "Et*16|t*16|t*16|t*13{m}L",
    32: "Et|(tt|)*30{m}L",
}


def row_model(row: dict, models: Path) -> tuple[str, dict]:
    """A model file for the row: the preset (or shape) with the row's sequence, MTP layers and truncation."""
    name = row["model"]
    spec = EXTRA_MODELS.get(name) or yaml.safe_load((PRESETS / f"{name}.yaml").read_text())
    spec = {**spec, "name": row["id"], "seq_length": row["layout"]["seq_length"]}
    spec["max_position_embeddings"] = max(spec.get("max_position_embeddings", 0), spec["seq_length"])
    spec["mtp_layers"] = int(row["layout"].get("mtp_layers") or 0)
    if row.get("truncated_layers"):
        spec["n_layers"] = row["truncated_layers"]
    path = models / f"{row['id']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path), spec


def pipeline_layout(row: dict, spec: dict) -> str | None:
    """The recipe's pipeline layout string, where the blocks do not split evenly or the recipe sets one."""
    lay = row["layout"]
    pp, vp = lay.get("pp", 1), lay.get("vp") or 1
    if pp == 1:
        return None
    mtp = "m" * spec["mtp_layers"]
    if row["model"] in ("deepseek-v3-671b", "kimi-k2-1t"):
        return BRIDGE_LAYOUTS[pp * vp].format(m=mtp)
    if "account_for" in str(lay.get("pipeline_split")) or spec["n_layers"] % (pp * vp):
        from toolkit.plan.pipeline_layout import account_for_edges

        return account_for_edges(spec["n_layers"], pp, vp, spec["mtp_layers"])
    return None


def dispatcher(row: dict) -> str | None:
    text = str(row["layout"].get("dispatcher") or "").lower()
    text = re.sub(r"\bnot \S+", "", text)  # "torchtitan default EP (all-to-all, not DeepEP)" is all-to-all
    for name in ("hybridep", "deepep"):
        if name in text:
            return name
    return "alltoall" if text else None


def flags(row: dict, models: Path, launch_us: float | None = None) -> list[str]:
    """`dstk estimate` flags that describe the row's run (module docstring); with `launch_us`, the cluster is its
    preset with that `kernel_launch_us`, written beside the model files."""
    lay = row["layout"]
    gpu = next(k for k in sorted(CLUSTERS, key=len, reverse=True) if row["gpu"].startswith(k))
    cluster = CLUSTERS[gpu]
    if launch_us is not None:
        spec = yaml.safe_load((CLUSTER_PRESETS / f"{cluster}.yaml").read_text())
        (models / f"{cluster}.yaml").write_text(yaml.safe_dump({**spec, "kernel_launch_us": launch_us}))
    model, spec = row_model(row, models)
    tp, pp, vp, cp, ep = (lay.get(k) or 1 for k in ("tp", "pp", "vp", "cp", "ep"))
    per_node = min(row["gpus"], GPUS_PER_NODE[cluster])  # the torchao rows ran on 4 GPUs of one node
    where = str(models / f"{cluster}.yaml") if launch_us is not None else cluster
    out = ["--model", model, "--cluster", where, "--nodes", str(row["gpus"] // per_node)]
    out += ["--gpus-per-node", str(per_node)] if per_node != GPUS_PER_NODE[cluster] else []
    out += ["--precision", PRECISION[row["precision"]], "--tp", str(tp), "--pp", str(pp), "--ep", str(ep)]
    out += ["--sp", str(cp)] if cp > 1 else []
    routing = str(row.get("routing") or "")
    balanced = routing.startswith("forced") or row["framework"].startswith("NeMo")
    out += ["--moe-routing", "balanced" if balanced else "natural"]
    if (d := dispatcher(row)) is not None:
        out += ["--moe-dispatcher", d]
    if row["framework"].startswith("torchtitan"):
        micro = lay["local_batch"]
        out += ["--fsdp", "fp32", "--zero-stage", "3", "--fused-kernels", "--flash-attention"]
        out += ["--micro-batch", str(micro), "--global-batch", str(micro * row["gpus"])]
        out += ["--recompute", "full" if lay.get("activation_checkpoint") == "full" else "none"]
        return out
    out += ["--micro-batch", str(lay["micro_batch"]), "--global-batch", str(lay["global_batch"])]
    out += ["--fused-kernels", "--flash-attention", "--attention-efficiency", "0.55", "--zero-stage", "1"]
    out += ["--fp8-scaling", "current"] if row["precision"] == "fp8-current" else []  # Bridge's fp8_cs
    out += ["--comm-overlap", "--etp", str(lay.get("etp") or 1)]
    if tp > 1:
        out += ["--tp-sequence-parallel", "--tp-vocab-parallel"]
    if vp > 1:
        out += ["--virtual-stages", str(vp)]
    if (layout := pipeline_layout(row, spec)) is not None:
        out += ["--pipeline-layout", layout]
    recompute = str(lay.get("recompute") or "none")
    out += ["--recompute", "selective" if recompute.startswith("selective") else "none"]
    if recompute.startswith("selective:"):  # Megatron-Core's recompute_modules, as the recipe lists them
        out += ["--recompute-modules", recompute.split(":", 1)[1].replace(" ", "")]
    if "full-iteration" in str(lay.get("cuda_graph")):
        out += ["--cuda-graphs"]
    overlap = str(lay.get("ep_comm_overlap") or "")
    if "true" in overlap.lower() and ep > 1 and (pp == 1 or vp > 1):
        out += ["--ep-comm-overlap"]
    return out


def generation(row: dict) -> str:
    return "Hopper" if row["gpu"].startswith("H100") else "Blackwell"


def summary(rows: list[dict]) -> list[str]:
    """Per GPU generation and over all rows: runs, median |ratio − 1|, the worst, and the range of ratios; then
    the median ratio of the rows with and without the full-iteration CUDA graph (the newest recipes), where
    the misses part."""
    lines = [
        error_line(group, [r["ratio"] for r in rows if group in ("all", r["group"])])
        for group in ("Hopper", "Blackwell", "all")
    ]
    for label, graphed in (("with --cuda-graphs", True), ("without", False)):
        ratios = [r["ratio"] for r in rows if ("--cuda-graphs" in r["args"]) is graphed]
        lines.append(f"{label}: {len(ratios)} runs, median ratio ×{statistics.median(ratios):.2f}")
    return lines


def controlled_pairs(data: dict, models: Path, launch_us: float | None = None) -> list[str]:
    """One line per controlled A/B pair (`controlled_pairs` in the data): a run measured with one recipe switch
    off and on, everything else held fixed, against dstk's step time for each — whether dstk prices what the
    switch buys, which the rows, each measured once, cannot show. Ratios as in the rows: dstk's throughput over
    the measured one (measured step time over dstk's)."""
    out = []
    for pair in data.get("controlled_pairs") or []:
        key = pair["toggled"]
        steps = {}
        for state in ("off", "on"):
            row = {**pair, "layout": {**pair["layout"], key: "True" if state == "on" else "False"}}
            steps[state] = estimate_json(flags(row, models, launch_us), pair["id"])["step_time_s"]
        measured = pair["step_s"]
        out.append(
            f"{pair['id']} ({key} off → on): measured {measured['off']:.2f} → {measured['on']:.2f} s "
            f"(×{measured['off'] / measured['on']:.2f}), dstk {steps['off']:.2f} → {steps['on']:.2f} s "
            f"(×{steps['off'] / steps['on']:.2f}); ratio ×{measured['off'] / steps['off']:.2f} off, "
            f"×{measured['on'] / steps['on']:.2f} on"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kernel-launch-us", type=float, metavar="US", help="reprice with this host cost per kernel"
    )
    launch_us = parser.parse_args(argv).kernel_launch_us
    if launch_us is not None and launch_us < 0:
        parser.error(f"--kernel-launch-us: a host cost per kernel in microseconds, >= 0; got {launch_us:g}")
    data = yaml.safe_load(DATA.read_text())
    models = Path(tempfile.mkdtemp(prefix="dstk-published-moe-"))
    rows = []
    for row in data["rows"]:
        args = flags(row, models, launch_us)
        est = estimate_json(args, row["id"])
        value = est["tokens_per_s"] / est["layout"]["world_size"]
        published = row["tokens_per_s_per_gpu"]
        shown = " ".join(a if not a.startswith(str(models)) else Path(a).name for a in args)
        rows.append(
            {
                "run": row["id"],
                "group": generation(row),
                "source": row["source"],
                "args": shown,
                "published": published,
                "predicted": value,
                "ratio": value / published,
                "fits": est["fits"],
                "memory_gib": est["memory_per_gpu_bytes"]["total"] / 2**30,
                "step_s": est["step_time_s"],
                "breakdown_s": est["step_time_breakdown_s"],
            }
        )
        b = est["step_time_breakdown_s"]
        print(
            f"{value / published:5.2f}  {value:8.0f} vs {published:6.0f} tok/s/GPU fits={est['fits']!s:5s} "
            f"{est['memory_per_gpu_bytes']['total'] / 2**30:6.1f} GiB  compute {b['compute']:.2f} bubble "
            f"{b['pipeline_bubble']:.2f} mp {b['model_parallel_comm']:.2f} dp {b['data_parallel_comm']:.2f}  {row['id']}"
        )
    pairs = controlled_pairs(data, models, launch_us)
    if launch_us is not None:  # a what-if, not the record
        print(f"kernel_launch_us {launch_us:g} on every cluster:", *summary(rows), *pairs, sep="\n")
        return 0
    write_report(
        "published_moe",
        [{**r, "group": r["group"]} for r in rows],
        "# dstk estimate vs published MoE training runs\n\nCommand: `python benchmarks/published_moe.py`. Metric: "
        "tokens/s per GPU. Rows: benchmarks/data/published_moe.yaml (sources, commits, layouts).",
        ["run", "published tok/s/GPU", "dstk", "ratio", "fits", "dstk GiB", "dstk estimate flags"],
        lambda r: [
            r["run"],
            f"{r['published']:g}",
            f"{r['predicted']:.0f}",
            f"{r['ratio']:.2f}",
            str(r["fits"]),
            f"{r['memory_gib']:.1f}",
            f"`{r['args']}`",
        ],
        summarize=lambda rs: summary(rs) + pairs,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
