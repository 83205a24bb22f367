"""benchmarks/published_moe.py's rows: where each comes from, and that dstk prices each as it was published.

The error figures are the benchmark's report (benchmarks/results/published_moe_*.md), not a target here; this
checks what does not depend on the cost model's accuracy — every row names its source and the commit it was
read at (a docs page's release section where the page has no repository), the set spans what the issue asks
(Megatron-Bridge and torchtitan, Hopper and Blackwell, BF16 and FP8), every left-out row says why, and every row's
flags are a layout `dstk estimate` accepts for that model and cluster.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import yaml

COMMIT = re.compile(r"\b[0-9a-f]{40}\b")


def _data() -> dict:
    moe = importlib.import_module("benchmarks.published_moe")
    return yaml.safe_load(Path(moe.DATA).read_text())


def test_every_row_names_its_source_and_the_set_spans_the_issues_groups() -> None:
    data = _data()
    rows = data["rows"]
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        cited = f"{row['source']} {row.get('config') or ''}"
        docs_page = row["framework"].startswith("NeMo") and "section" in row["source"]
        assert COMMIT.search(cited) or docs_page, row["id"]
        assert row["tokens_per_s_per_gpu"] > 0 and row["layout"], row["id"]
    committed = [r for r in rows if r["framework"].startswith(("Megatron-Bridge", "torchtitan"))]
    assert len(committed) >= 40 and all(COMMIT.search(r["source"]) for r in committed)
    gpus = {r["gpu"].split()[0].split("-")[0] for r in rows}
    assert {"H100", "B200", "GB200"} <= gpus
    assert {"bf16", "mxfp8", "fp8-current"} <= {r["precision"] for r in rows}
    assert all(x["why"].strip() for x in data["left_out"])


def test_every_row_is_priced_with_its_published_layout(tmp_path: Path) -> None:
    """Each row's flags go through `dstk estimate` unrefused, on the row's GPU count and layout."""
    moe = importlib.import_module("benchmarks.published_moe")
    from benchmarks.published_runs import estimate_json

    for row in _data()["rows"]:
        est = estimate_json(moe.flags(row, tmp_path), row["id"])
        lay = row["layout"]
        assert est["layout"]["world_size"] == row["gpus"], row["id"]
        assert est["layout"]["ep"] == (lay.get("ep") or 1) and est["layout"]["pp"] == (lay.get("pp") or 1)
        assert est["tokens_per_s"] > 0, row["id"]


def test_a_controlled_pair_differs_only_by_its_switch(tmp_path: Path) -> None:
    """A controlled A/B pair is priced twice with the same flags but its one switch: the measured on/off ratio is
    compared with what dstk makes of that switch alone."""
    moe = importlib.import_module("benchmarks.published_moe")
    data = _data()
    pairs = data["controlled_pairs"]
    assert pairs
    for pair in pairs:
        assert COMMIT.search(pair["source"]) and set(pair["step_s"]) == {"off", "on"}
        key = pair["toggled"]
        off, on = (
            moe.flags({**pair, "layout": {**pair["layout"], key: state}}, tmp_path)
            for state in ("False", "True")
        )
        assert set(on) - set(off) == {"--ep-comm-overlap"} and len(on) == len(off) + 1
    (line,) = moe.controlled_pairs(data, tmp_path)
    assert line.startswith(pairs[0]["id"]) and "measured 24.71 → 20.99 s" in line
