"""One Markdown file from a benchmarks/gpu_check.sh run: the steps' status and time, detection, calibration, the
demo's measured-vs-predicted lines, the 7B-block Llama at ZeRO-1 and ZeRO-3 beside its prediction and the bare
loop, the CUDA paths, and what nvidia-smi dmon saw (power, clocks, throttling). Also a JSON of every record.
Usage: python benchmarks/gpu_check_report.py --work DIR --out DIR --seconds N
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import contextlib

from benchmarks.common import stamp


def _steps(work: Path) -> list[tuple[str, int, int]]:
    path = work / "steps.tsv"
    rows = [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []
    return [(name, int(rc), int(s)) for name, rc, s in rows]


def _log(work: Path, name: str) -> str:
    path = work / "logs" / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _comparison(text: str) -> list[str]:
    """The "Measured vs predicted" table dstk train prints at the end of a run, and the lines under it."""
    lines = text.splitlines()
    start = max((i for i, ln in enumerate(lines) if ln.startswith("Measured vs predicted")), default=None)
    return [] if start is None else lines[start : start + 9]


def dmon_summary(text: str) -> dict[str, object]:
    """Per column of `nvidia-smi dmon -s pucvm -o T` (header line '# Time gpu pwr gtemp mtemp sm mem ...'): the
    minimum, median and maximum over the samples, and how many samples had a non-zero throttle counter."""
    header: list[str] = []
    rows: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("#") and "gpu" in line and not header:
            header = line.lstrip("#").split()
        elif line.strip() and not line.startswith("#") and header:
            rows.append(line.split())
    out: dict[str, object] = {"samples": len(rows)}
    for i, col in enumerate(header):
        values = []
        for r in rows:
            with contextlib.suppress(IndexError, ValueError):
                values.append(float(r[i]))
        if values and col not in ("Time", "gpu"):
            out[col] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
            if col in ("pviol", "tviol"):
                out[f"{col}_samples_nonzero"] = sum(v > 0 for v in values)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=int, required=True)
    args = ap.parse_args()
    work = args.work
    records = {p.stem: json.loads(p.read_text()) for p in sorted((work / "records").glob("*.json"))}
    calibration = None
    with contextlib.suppress(json.JSONDecodeError):
        calibration = json.loads(_log(work, "calibrate"))
    dmon = dmon_summary(_log(work, "dmon"))
    lines = [
        f"# GPU check ({args.seconds} s)",
        "",
        "Command: `bash benchmarks/gpu_check.sh` (steps in order; a failed step does not stop the rest)",
        "",
        "| step | exit | seconds |",
        "|---|---|---|",
        *(f"| {n} | {rc} | {s} |" for n, rc, s in _steps(work)),
        "",
        "## Detection (`dstk env`)",
        "",
        "```",
        *_log(work, "env").strip().splitlines()[-25:],
        "```",
        "",
        "## The demo (measured vs predicted)",
        "",
        "```",
        *_comparison(_log(work, "demo")),
        "```",
    ]
    for stage in (1, 3):
        r = records.get(f"hf_step_zero{stage}")
        if not r:
            continue
        pred = r["predicted"]["step_time_s"]
        lines += [
            "",
            f"## {r['model']['name']} (seq {r['model']['seq_length']}), ZeRO-{stage}, {r['precision']}, against "
            f"`--cluster {r['cluster']}`",
            "",
            f"- step time (median after warm-up): {r['measured_step_time_s']:.4f} s measured, {pred:.4f} s "
            f"predicted: **×{r['measured_step_time_s'] / pred:.2f}** (goal ×0.8–1.25); MFU {r['measured_mfu']:.3f}",
            f"- trend: slope {r['trend']['slope_per_step']:+.4f} of the median per step; last 10 over first 10 "
            f"×{r['trend']['last_over_first']:.3f}",
            f"- dstk train / bare DeepSpeed loop: **×{r.get('dstk_over_bare', float('nan')):.3f}** (goal ≤ 1.03)",
            f"- peak memory per rank: {max(r['peak_memory_bytes']) / 1e9:.2f} GB measured, "
            f"{r['predicted_memory_bytes'] / 1e9:.2f} GB predicted",
            "- every step (s): " + ", ".join(f"{t:.3f}" for t in r["measured_step_times_s"]),
        ]
    paths = records.get("gpu_paths") or []
    if paths:
        lines += ["", "## CUDA paths", "", "| path | ok | seconds | detail |", "|---|---|---|---|"]
        for p in paths:
            detail = p.get("resumed_from") or (
                f"loss {p['losses'][0]:.3f} → {p['losses'][-1]:.3f}" if p.get("losses") else ""
            )
            if not p.get("ok"):
                detail = (p.get("tail") or "").strip().splitlines()[-1:] or [""]
                detail = detail[0][:200]
            lines.append(
                f"| {p['name']} | {'yes' if p.get('ok') else '**no**'} | {p.get('seconds')} | {detail} |"
            )
    if dmon.get("samples"):
        lines += ["", "## nvidia-smi dmon over the whole check", "", "```", json.dumps(dmon, indent=1), "```"]
    if calibration:
        lines += ["", "## dstk calibrate --json", "", "```", json.dumps(calibration, indent=1)[:4000], "```"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    (args.out / "gpu_check.json").write_text(
        json.dumps(
            {**stamp(), "records": records, "calibration": calibration, "dmon": dmon, "steps": _steps(work)},
            indent=1,
        )
        + "\n"
    )
    print("\n".join(lines[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
