"""`dstk calibrate`: measure this machine with N local ranks and write a cluster description (YAML)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=2, metavar="N", help="local ranks to measure with (2)")
    parser.add_argument("--name", default="calibrated", help="cluster name in the written file")
    parser.add_argument(
        "--nvme-path", type=Path, metavar="DIR", help="also measure write/read bandwidth here"
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, metavar="FILE", help="cluster YAML to write"
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the raw per-rank measurements as JSON"
    )


def run(args: argparse.Namespace) -> int:
    import yaml

    from toolkit.calibrate import cluster_description, measure
    from toolkit.commands import print_json
    from toolkit.errors import UserError
    from toolkit.load import build
    from toolkit.specs import ClusterSpec

    if not 1 <= args.ranks <= 1024:
        raise UserError(f"--ranks: {args.ranks} must be in 1 .. 1024")
    if args.nvme_path is not None and not args.nvme_path.is_dir():
        raise UserError(f"--nvme-path: {args.nvme_path} is not a directory")
    results = measure(args.ranks, str(args.nvme_path) if args.nvme_path else None)
    desc = cluster_description(results, args.name)
    build(ClusterSpec, desc, "calibration")  # what we write must load
    header = (
        f"# Written by `dstk calibrate --ranks {args.ranks}`: measured on this machine, {args.ranks} ranks at once.\n"
        "# gpu_peak_tflops: large bf16 GEMMs per rank; gpu_matmul_efficiency: training-sized Linear forward +\n"
        "# backward over that; attention_efficiency: causal SDPA forward + backward over it;\n"
        "# gpu_memory_gb_per_s: bf16 elementwise kernels; cpu_memory_gb_per_s: copies, all ranks together;\n"
        "# collective_bus_gb_per_s / collective_latency_us: alpha-beta fits of each collective in bf16 (bus\n"
        "# bandwidth as nccl-tests defines it), intra_node_gb_per_s the all-reduce's; kernel_launch_us: one\n"
        "# GPT-2 block's host cost per micro-batch over its kernels; step_overhead_ms: the engine's fixed cost\n"
        "# per step; optimizer_ns_per_param (CPU): DeepSpeed's optimizer step per updated parameter, ZeRO-0\n"
        "# (replicated) and ZeRO-1/2/3 (partitioned);\n"
        "# framework_overhead_gib: RSS after imports, process-group set-up and a tiny model's training steps.\n"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(header + yaml.safe_dump(desc, sort_keys=False))
    if args.json:
        print_json(results)
    print(f"wrote {args.output}")
    return 0
