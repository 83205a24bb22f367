"""Pipeline layouts: Megatron-Core's layout strings, dstk's even split, Megatron's account-for-edges placement.

The expected placements are the ones Megatron-LM's own `PipelineParallelLayerLayout` prints for the same strings
(megatron/core/transformer/pipeline_parallel_layer_layout.py @ NVIDIA/Megatron-LM d98e8a64, run on CPU)."""

from __future__ import annotations

import pytest

from toolkit.errors import UserError
from toolkit.plan import pipeline_layout as pl


def test_megatron_example_places_embedding_mtp_and_loss_where_megatron_does() -> None:
    """`Et*3|(tt|)*29m|L` on PP 16 is VPP 2: rank 0 holds the embedding and 3 + 2 blocks, rank 14 two blocks and
    the MTP layer (its second virtual stage), rank 15 two blocks and the loss."""
    text = "Et*3|(tt|)*29m|L"
    assert pl.problem(text, 61, 1, 16, 2) is None
    ranks = pl.rank_stages(61, 16, 2, text, 1)
    assert [len(r.blocks) for r in ranks] == [5] + [4] * 13 + [2, 2]
    assert ranks[0].embedding and not ranks[0].head and ranks[0].blocks[:3] == (0, 1, 2)
    assert ranks[14].mtp == 1 and ranks[15].head and ranks[15].mtp == 0
    assert sum(len(r.blocks) for r in ranks) == 61 and all(r.chunks == 2 for r in ranks)
    assert sorted(b for r in ranks for b in r.blocks) == list(range(61))


def test_qwen3_235b_on_pp8_vpp4_accounts_for_embedding_and_loss() -> None:
    """94 blocks + embedding + loss = 96 slots, 3 per virtual stage (Megatron-Bridge's Qwen3-235B recipes)."""
    text = pl.account_for_edges(94, 8, 4)
    assert text is not None and pl.problem(text, 94, 0, 8, 4) is None
    ranks = pl.rank_stages(94, 8, 4, text)
    assert [len(r.blocks) for r in ranks] == [11] + [12] * 6 + [11]
    assert pl.account_for_edges(95, 8, 4) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("Et*2|(t*3|)*30tL", "93 decoder blocks t, but the model has n_layers(94)"),
        ("tE|" + "t*3|" * 30 + "t*2L", "the embedding E must open the first stage"),
        ("Et*2|(t*3|)*30t*2", "the loss L must close the last stage"),
        ("Et*2|(t*3|)*29t*2L", "31 stages, but pp(8) × virtual stages(4) = 32"),
        ("Et*2|((t|)*3)*2", "groups cannot nest"),
        ("Et*2|(t*3|)30t*2L", "every group needs a repeat count"),
        ("Et*2|(t*3|)*30x*2L", "unknown symbol(s) 'x'"),
    ],
)
def test_bad_layouts_are_one_line_naming_the_flag(text: str, why: str) -> None:
    msg = pl.problem(text, 94, 0, 8, 4)
    assert msg is not None and msg.startswith("--pipeline-layout: ") and why in msg and "\n" not in msg


def test_mtp_must_follow_every_block_and_match_the_model() -> None:
    assert "no decoder block t may follow an MTP layer" in pl.problem("Et|mt|L", 2, 1, 3, 1)
    assert "1 MTP layers m, but the model has mtp_layers(0)" in pl.problem("Et|t|mL", 2, 0, 3, 1)


def test_even_split_earlier_stages_take_the_remainder_and_round_trips() -> None:
    text = pl.even_layout(61, 8, 2, 1)
    assert pl.problem(text, 61, 1, 8, 2) is None
    assert pl.parse(text)[0] == "E" + "t" * 4 and pl.parse(text)[-1] == "t" * 3 + "mL"
    ranks = pl.rank_stages(61, 8, 2, None, 1)
    assert ranks == pl.rank_stages(61, 8, 2, text, 1)
    assert ranks[-1].head and ranks[-1].mtp == 1 and ranks[0].embedding


def test_parse_errors_are_user_errors() -> None:
    with pytest.raises(UserError, match="unknown symbol"):
        pl.parse("Ez|L")
