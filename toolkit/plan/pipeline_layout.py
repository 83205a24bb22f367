"""Which blocks each pipeline rank holds: an even split, or Megatron-Core's layout string.

Megatron-Core places layers by `--pipeline-model-parallel-layout` (megatron/core/transformer/
pipeline_parallel_layer_layout.py @ NVIDIA/Megatron-LM d98e8a64, `PipelineParallelLayerLayout`): virtual
stages separated by `|`, each a string of `E` (the embedding), `t` (a decoder block), `m` (a multi-token
prediction layer) and `L` (the loss: final norm and LM head); `x*n` repeats one character and `(...)*n` a
group (no nesting); commas are cosmetic. There are pp × v virtual stages, listed virtual-stage-major: stage i
runs on pipeline rank i mod pp as its virtual stage i // pp. The layout must hold `E` first and `L` last once
each, exactly n_layers `t` and mtp_layers `m`, and no `t` after the first `m`. The rank that holds the most work
sets the pipeline's pace, and the rank holding the embedding or the loss holds their parameters and, for the
loss, the logits — which is why published layouts give the first and last stage fewer blocks (`Et*3|...|tmL`).

Without a layout string dstk splits the blocks evenly over the pp × v virtual stages, earlier stages taking the
remainder, the embedding on rank 0 and the loss (and MTP layers) on rank pp − 1.
`account_for_edges` writes Megatron's `--account-for-embedding-in-pipeline-split
--account-for-loss-in-pipeline-split` placement (the embedding and the loss each counted as one block) as a
layout string, how Megatron-Bridge splits Qwen3-235B's 94 blocks over 8 × 4 stages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.errors import UserError

FLAG = "--pipeline-layout"


@dataclass(frozen=True)
class RankStage:
    """What one pipeline rank holds over all its virtual stages."""

    index: int
    blocks: tuple[int, ...]
    """The decoder blocks (indices from 0) on this rank."""
    embedding: bool
    head: bool
    """The final norm, LM head and loss."""
    mtp: int = 0
    """Multi-token-prediction layers on this rank."""
    chunks: int = 1
    """Virtual stages on this rank."""


def parse(text: str) -> list[str]:
    """The virtual stages of a layout string, each a string over `EtmL` (one-line UserError if malformed)."""
    s = text.replace(",", "").replace(" ", "")
    if re.search(r"\([^)]*\(", s):
        raise UserError(f"{FLAG}: groups cannot nest in {text!r}")
    s = re.sub(r"\(([^()]+)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), s)
    if "(" in s or ")" in s:
        raise UserError(f"{FLAG}: every group needs a repeat count, as in (tt|)*4; got {text!r}")
    s = re.sub(r"(.)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), s)
    bad = sorted(set(s) - set("EtmL|"))
    if bad:
        raise UserError(
            f"{FLAG}: unknown symbol(s) {''.join(bad)!r} in {text!r}; use E, t, m, L, |, x*n and (...)*n"
        )
    return s.split("|")


def problem(text: str, n_layers: int, mtp_layers: int, pp: int, virtual_stages: int) -> str | None:
    """Why `text` is not a layout of this model on pp × virtual_stages stages (None if it is)."""
    try:
        stages = parse(text)
    except UserError as e:
        return str(e)
    flat = "".join(stages)
    if len(stages) != pp * virtual_stages:
        return (
            f"{FLAG}: {len(stages)} stages, but pp({pp}) × virtual stages({virtual_stages}) = "
            f"{pp * virtual_stages}"
        )
    if flat.count("E") != 1 or not stages[0].startswith("E"):
        return f"{FLAG}: the embedding E must open the first stage, once"
    if flat.count("L") != 1 or not stages[-1].endswith("L"):
        return f"{FLAG}: the loss L must close the last stage, once"
    if flat.count("t") != n_layers:
        return f"{FLAG}: {flat.count('t')} decoder blocks t, but the model has n_layers({n_layers})"
    if flat.count("m") != mtp_layers:
        return f"{FLAG}: {flat.count('m')} MTP layers m, but the model has mtp_layers({mtp_layers})"
    if "m" in flat and "t" in flat[flat.index("m") :]:
        return f"{FLAG}: no decoder block t may follow an MTP layer m"
    return None


def rank_stages(
    n_layers: int, pp: int, virtual_stages: int, text: str | None, mtp_layers: int = 0
) -> list[RankStage]:
    """What each of the pp ranks holds, from `text` or the even split (module docstring). `text` must have
    passed `problem`."""
    stages = parse(text) if text else _even(n_layers, pp * virtual_stages, mtp_layers)
    starts = [0]
    for stage in stages:
        starts.append(starts[-1] + stage.count("t"))
    out = []
    for rank in range(pp):
        mine = range(rank, len(stages), pp)
        blocks = tuple(j for i in mine for j in range(starts[i], starts[i + 1]))
        joined = "".join(stages[i] for i in mine)
        out.append(RankStage(rank, blocks, "E" in joined, "L" in joined, joined.count("m"), len(mine)))
    return out


def _even(n_layers: int, n_stages: int, mtp_layers: int) -> list[str]:
    per, extra = divmod(n_layers, n_stages)
    stages = ["t" * (per + (1 if i < extra else 0)) for i in range(n_stages)]
    stages[0] = "E" + stages[0]
    stages[-1] += "m" * mtp_layers + "L"
    return stages


def account_for_edges(n_layers: int, pp: int, virtual_stages: int, mtp_layers: int = 0) -> str | None:
    """Megatron's placement with the embedding and the loss each counted as one block, as a layout string; None
    where (n_layers + 2) does not split evenly over the stages."""
    n_stages = pp * virtual_stages
    slots = n_layers + 2
    if slots % n_stages:
        return None
    per = slots // n_stages
    stages = ["t" * per for _ in range(n_stages)]
    stages[0] = "E" + "t" * (per - 1)
    stages[-1] = "t" * (per - 1) + "m" * mtp_layers + "L"
    return "|".join(stages)


def compact(stages: list[str]) -> str:
    """A layout string for `stages`, runs of one symbol written `x*n` (what Megatron's parser reads back)."""
    return "|".join(re.sub(r"(.)\1+", lambda g: f"{g.group(1)}*{len(g.group(0))}", s) for s in stages)


def even_layout(n_layers: int, pp: int, virtual_stages: int, mtp_layers: int = 0) -> str:
    """dstk's default split as a Megatron layout string."""
    return compact(_even(n_layers, pp * virtual_stages, mtp_layers))
