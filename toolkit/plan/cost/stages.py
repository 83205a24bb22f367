"""Which blocks each pipeline rank of a layout holds, as the cost model walks them: the ranks of
toolkit/plan/pipeline_layout.py with their MoE blocks counted, and the candidates for the most loaded rank."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from toolkit.plan import pipeline_layout
from toolkit.plan.layout import Layout
from toolkit.plan.specs import ModelSpec


def stage_blocks(
    model: ModelSpec, pp: int, virtual_stages: int = 1, layout: str | None = None
) -> list[tuple[int, int]]:
    """(blocks, MoE blocks) per pipeline rank: placed by a Megatron-Core layout string, or split evenly over
    the pp × virtual_stages stages, earlier stages taking the remainder (toolkit/plan/pipeline_layout.py);
    block j is MoE when `model.moe_layer(j)`."""
    return [(st.blocks, st.moe_blocks) for st in stages_of(model, pp, virtual_stages, layout)]


@dataclass(frozen=True)
class Stage:
    index: int
    blocks: int
    moe_blocks: int
    embedding: bool
    head: bool
    mtp: int = 0

    def signature(self) -> tuple[int, int, bool, bool, int]:
        return (self.blocks, self.moe_blocks, self.embedding, self.head, self.mtp)


def stages_of(model: ModelSpec, pp: int, virtual_stages: int = 1, layout: str | None = None) -> list[Stage]:
    """The pipeline ranks of `model` (the planner asks for the same few thousands of times: cached by what
    decides them, the block count and which blocks are MoE)."""
    kinds = tuple(model.moe_layer(j) for j in range(model.n_layers)) if model.trace is not None else None
    key = (model.n_layers, model.is_moe, model.first_dense_layers, model.moe_layer_interval, kinds)
    return list(_stages(key, model.mtp_layers, pp, virtual_stages, layout))


@functools.lru_cache(maxsize=4096)
def _stages(
    key: tuple, mtp_layers: int, pp: int, virtual_stages: int, layout: str | None
) -> tuple[Stage, ...]:
    n_layers, is_moe, first_dense, interval, kinds = key

    def moe(j: int) -> bool:
        if kinds is not None:
            return kinds[j]
        return is_moe and j >= first_dense and (j + 1) % interval == 0

    return tuple(
        Stage(r.index, len(r.blocks), sum(1 for j in r.blocks if moe(j)), r.embedding, r.head, r.mtp)
        for r in pipeline_layout.rank_stages(n_layers, pp, virtual_stages, layout, mtp_layers)
    )


def layout_stages(model: ModelSpec, layout: Layout) -> list[Stage]:
    return stages_of(model, layout.pp, layout.virtual_stages, layout.pipeline_layout)


def candidate_stages(model: ModelSpec, layout: Layout) -> list[Stage]:
    """The stages that can be the most loaded: the first of each signature (earlier stages keep more
    micro-batches in flight, so later stages of the same signature never need more memory)."""
    seen: dict[tuple[int, int, bool, bool, int], Stage] = {}
    for st in layout_stages(model, layout):
        seen.setdefault(st.signature(), st)
    return list(seen.values())


def with_mtp(model: ModelSpec, st: Stage) -> tuple[int, int]:
    """(blocks, MoE blocks) a stage holds counting its MTP layers as blocks of the last block's kind (each
    also has a 2h → h projection and two norms, left out)."""
    moe = st.mtp if model.moe_layer(model.n_layers - 1) else 0
    return st.blocks + st.mtp, st.moe_blocks + moe
