"""ZeRO-Infinity on this machine: parameters and optimizer states on NVMe, activation checkpoints in host memory.

One run of a Llama-shaped model (h=1024, 2 blocks, fp32: every weight's partition is above DeepSpeed's 1 MiB
swap floor) through `dstk config` + `dstk launch` → `dstk train` on 2 ranks with `--zero-stage 3
--offload-optimizer nvme --offload-param nvme --recompute full --offload-activations`, swap files under a local
directory (`--nvme-path`, default a fresh one under /tmp, which must allow O_DIRECT: ext4/xfs, not tmpfs), and
beside it the same model at ZeRO-3 without offload, for the step-time ratio.

Per rank, from each run's `summary.json` (`offload_on_rank`, read from the engine and the swap directory at the
end): the host bytes the offloading ZeRO-3 optimizer allocated (pinned gradient partitions, `max_in_cpu`
buffer, optimizer swap buffers, parameter swap pool and write-back buffer) and the bytes of the rank's swap
files, against `dstk estimate`'s `offload_per_rank_bytes` (host states + swap buffers; NVMe). The activation
checkpoints are not in the host figure: on the CPU accelerator they never leave host memory, so no buffer
tells them apart.

The first run installs `libaio-dev` when its header is missing (tests/testbed/install.sh nvme), then JIT-builds
DeepSpeed's async_io op (about 7 min on 2 cores) and cpu_adam
into the op cache (`TORCH_EXTENSIONS_DIR`, the venv's by default). Writes JSON and Markdown to
benchmarks/results/.

Usage: python benchmarks/infinity.py [--steps N] [--nvme-path DIR] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import REPO, bench_env, command_line, output_paths, prepare_data, train, write_record

MODEL = {
    "name": "llama-h1024",
    "architecture": "llama",
    "n_layers": 2,
    "hidden_size": 1024,
    "n_heads": 8,
    "vocab_size": 4096,
    "seq_length": 256,
}
INFINITY = [
    "--zero-stage", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme",
    "--recompute", "full", "--offload-activations",
]  # fmt: skip
PLAIN = ["--zero-stage", "3", "--recompute", "full"]
COMMON = ["--precision", "fp32", "--micro-batch", "2", "--global-batch", "4"]


def _install_libaio() -> None:
    """DeepSpeed's async_io op compiles against libaio (`<libaio.h>`, `-laio`): installed the way the test beds
    install their packages (apt, as root; tests/testbed/install.sh says why when it cannot)."""
    if not Path("/usr/include/libaio.h").exists():
        subprocess.run(["bash", str(REPO / "tests" / "testbed" / "install.sh"), "nvme"], check=True)


def _cluster(tmp: Path) -> Path:
    """The `cpu` preset with this disk as NVMe (the preset says none), as a cluster file."""
    from toolkit.host.local import load_cluster

    free = shutil.disk_usage(tmp).free / 2**30
    spec = load_cluster("cpu").model_copy(update={"name": "cpu-nvme", "nvme_gib": round(free * 0.5, 1)})
    path = tmp / "cpu-nvme.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(exclude_none=True)))
    return path


def _rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    predicted = summary["predicted"]["offload_per_rank_bytes"]
    host = predicted["host_states"] + predicted["host_swap_buffers"]
    rows = []
    for rank, measured in enumerate(summary["offload_on_rank"]):
        rows.append(
            {
                "rank": rank,
                "host_measured_mb": measured["host"] / 1e6,
                "host_predicted_mb": host / 1e6,
                "host_ratio": measured["host"] / host,
                "nvme_measured_mb": measured["nvme"] / 1e6,
                "nvme_predicted_mb": predicted["nvme"] / 1e6,
                "nvme_ratio": measured["nvme"] / predicted["nvme"],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--nvme-path", type=Path, default=None)
    ap.add_argument("--out-dir", type=Path, default=None)
    args = ap.parse_args()
    _install_libaio()
    env = bench_env()
    with tempfile.TemporaryDirectory(prefix="dstk-infinity-", dir="/tmp") as d:
        tmp = Path(d)
        nvme = args.nvme_path or tmp / "nvme"
        nvme.mkdir(parents=True, exist_ok=True)
        model_file = tmp / "model.yaml"
        model_file.write_text(yaml.safe_dump(MODEL))
        cluster = str(_cluster(tmp))
        data = prepare_data(tmp, MODEL, 40)
        runs = {}
        for name, layout in (("infinity", INFINITY), ("zero3", PLAIN)):
            runs[name] = train(
                tmp / name,
                model_file,
                cluster,
                data,
                args.steps,
                [*layout, *COMMON],
                env,
                config_extra=("--nvme-path", str(nvme)),
            )
    inf, plain = runs["infinity"], runs["zero3"]
    rows = _rows(inf)
    step = {
        name: {"measured_s": r["step_time_s"], "predicted_s": r["predicted"]["step_time_s"]}
        for name, r in runs.items()
    }
    record = {
        "command": command_line(),
        "model": MODEL,
        "layout": inf["layout"],
        "losses": {name: r["losses"] for name, r in runs.items()},
        "offload_per_rank": rows,
        "step_time": step,
        "step_ratio_infinity_over_zero3": inf["step_time_s"] / plain["step_time_s"],
    }
    paths = output_paths("infinity", args.out_dir)
    write_record(paths["json"], record)
    lines = [
        "# ZeRO-Infinity on 2 CPU ranks: measured vs predicted footprint",
        "",
        f"Command: `{record['command']}`",
        "",
        "| rank | host MB measured | predicted | ratio | NVMe MB measured | predicted | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rank']} | {r['host_measured_mb']:.1f} | {r['host_predicted_mb']:.1f} | {r['host_ratio']:.3f} "
            f"| {r['nvme_measured_mb']:.1f} | {r['nvme_predicted_mb']:.1f} | {r['nvme_ratio']:.3f} |"
        )
    lines += [
        "",
        "| run | step s measured | predicted |",
        "|---|---|---|",
        *[f"| {n} | {v['measured_s']:.3f} | {v['predicted_s']:.3f} |" for n, v in step.items()],
        "",
        f"Losses (ZeRO-Infinity): {', '.join(f'{x:.4f}' for x in inf['losses'])}",
        f"Losses (ZeRO-3):        {', '.join(f'{x:.4f}' for x in plain['losses'])}",
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
