"""`dstk calibrate`: measure this machine with N local ranks and write a cluster description (YAML).

The result is cached per host fingerprint (toolkit.host.calibration_cache: CPU model and flags, cores, GPU model and
driver, rank count, torch/DeepSpeed versions) under the user's cache directory, where `--cluster local`
finds it. The probes are sized from a first tiny measurement, so the whole run takes under a minute on a
host whose bf16 is emulated as on one with native bf16 (DeepSpeed's first-time op build aside).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

HEADER = """\
# gpu_peak_tflops / gpu_fp32_peak_tflops: large 16-bit (bf16 on CPU, emulated where the ISA lacks it) and
# fp32 GEMMs per rank; the probes run in the fastest precision, `precision` below: gpu_matmul_efficiency is
# training-sized Linear forward + backward over the large GEMM in it, attention_efficiency causal SDPA
# forward + backward over it; gpu_memory_gb_per_s: elementwise kernels; cpu_memory_gb_per_s: host copies, all
# ranks together; collective_bus_gb_per_s / collective_latency_us: alpha-beta fits of each collective (bus
# bandwidth as nccl-tests defines it), intra_node_gb_per_s the all-reduce's; kernel_launch_us: one GPT-2
# block's host cost per micro-batch over its kernels; step_overhead_ms: the engine's fixed cost per step;
# optimizer_ns_per_param (CPU): DeepSpeed's optimizer step per updated parameter, ZeRO-0 (replicated) and
# ZeRO-1/2/3 (partitioned); framework_overhead_gib: on the CPU RSS after imports, process-group set-up and
# a tiny model's training steps, on a GPU what the device holds outside torch's pool (context, NCCL);
# storage_gb_per_s: write + fsync + SHA-256 at --checkpoint-path, a save's cost.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ranks", type=int, metavar="N", help="local ranks to measure with (default: as --cluster local)"
    )
    parser.add_argument("--name", default="calibrated", help="cluster name in the written file")
    parser.add_argument(
        "--nvme-path", type=Path, metavar="DIR", help="also measure write/read bandwidth here"
    )
    parser.add_argument(
        "--checkpoint-path",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="where checkpoints will go: write + fsync + SHA-256 of 64 MB there prices each save "
        "(storage_gb_per_s; default: the current directory)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="cluster YAML to write (the host's cache, which --cluster local reads, is written either way)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="when this host's cache already holds a calibration for these ranks, use it instead of measuring",
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the raw per-rank measurements as JSON"
    )


def run(args: argparse.Namespace) -> int:
    import yaml

    from toolkit.commands import print_json
    from toolkit.errors import UserError
    from toolkit.host.calibration_cache import calibration_path
    from toolkit.host.local import detect
    from toolkit.plan.load import build
    from toolkit.plan.specs import ClusterSpec

    if args.ranks is not None and not 1 <= args.ranks <= 1024:
        raise UserError(f"--ranks: {args.ranks} must be in 1 .. 1024")
    if args.nvme_path is not None and not args.nvme_path.is_dir():
        raise UserError(f"--nvme-path: {args.nvme_path} is not a directory")
    if not args.checkpoint_path.is_dir():
        raise UserError(f"--checkpoint-path: {args.checkpoint_path} is not a directory")
    if args.output:
        from toolkit.paths import output_file

        output_file(args.output, "-o")
    host = detect(ranks=args.ranks, use_cache=False)
    ranks = args.ranks or host.cluster["gpus_per_node"]
    cached = calibration_path(host.fingerprint)
    if args.reuse and cached.is_file():
        print(f"using this host's calibration {cached} (delete it or drop --reuse to measure again)")
        if args.output:
            _write(args.output, cached.read_text())
        return 0

    from toolkit.host.calibration import cluster_description
    from toolkit.run.calibrate import measure, storage_gb_per_s

    what = host.hardware.get("gpu") or host.hardware.get("cpu")
    start = time.monotonic()
    print(f"calibrating {what} with {ranks} ranks ...", flush=True)
    results = measure(ranks, str(args.nvme_path) if args.nvme_path else None)
    desc = cluster_description(results, args.name)
    desc["storage_gb_per_s"] = round(storage_gb_per_s(args.checkpoint_path), 3)
    build(ClusterSpec, desc, "calibration")  # what we write must load
    took = time.monotonic() - start
    text = (
        f"# Written by `dstk calibrate --ranks {ranks}` in {took:.0f} s: measured on this machine, {ranks} ranks "
        f"at once.\n# Host: {what}; fingerprint "
        f"{host.fingerprint}; training precision measured fastest: {results[0]['precision']}.\n"
        + HEADER
        + yaml.safe_dump(desc, sort_keys=False)
    )
    _write(cached, text)
    if args.output:
        _write(args.output, text)
    if args.json:
        print_json(results)
    rates = results[0]["large_tflops"]
    print(
        f"measured in {took:.0f} s: "
        + ", ".join(f"{p} {v * 1e3:,.3g} GFLOP/s" for p, v in rates.items())
        + f" per rank; fastest precision {results[0]['precision']}"
    )
    print(
        f"wrote {args.output or cached}"
        + (f" and {cached}" if args.output else "")
        + "; --cluster local uses it"
    )
    return 0


def _write(path: Path, text: str) -> None:
    from toolkit.errors import UserError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        shutil.move(str(tmp), path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
