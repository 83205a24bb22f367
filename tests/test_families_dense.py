"""The dense families of the table, as a user brings them — a folder with a `config.json` — trained on 2 gloo
ranks through `dstk launch` (ZeRO-2, fp32, 4 steps), exported, and the export's logits equal to those of
transformers' own model built from that config.json with DeepSpeed's consolidated fp32 weights; and a model
type the table has no entry for (OLMoE), traced and trained the same way."""

from __future__ import annotations

import pytest
import torch

from tests.families import export, logits, reference, tiny, train

pytestmark = pytest.mark.multiprocess


@pytest.mark.parametrize("family", ["qwen3", "olmo2", "gemma2", "phi3", "olmoe"])
def test_a_tiny_model_of_the_family_trains_and_exports_what_its_config_builds(
    tmp_path, prepared_data, family: str
) -> None:
    model = tiny(family)
    job = train(tmp_path, model, prepared_data, family)
    losses = job.summary["losses"]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert torch.allclose(
        logits(export(tmp_path, model, family)),
        logits(reference(model, tmp_path, family)),
        atol=1e-5,
        rtol=1e-5,
    )
