"""The MoE families of the table in transformers 5's fused-expert form, as a user brings them (a folder with a
`config.json`), on 2 gloo ranks through `dstk launch` (ZeRO-2, fp32, 4 steps): with expert parallelism 2 —
DeepSpeed's AutoEP for DeepSeek-V3, GLM-4.5 and Llama 4, dstk's own conversion for gpt-oss
(ArchitectureFacts.expert_parallel) — each rank holds half of every block's experts, as the estimate says, and
the losses are those of ep 1; both runs export to models with equal logits, equal to transformers' own model
built from the config.json with the ep-1 run's consolidated weights. DeepSeek-V3 also runs with its experts
sharded by AutoEP at ZeRO-3, where dstk's own conversion is refused (DeepSpeed's MoE layer is not ZeRO-3's)."""

from __future__ import annotations

import pytest
import torch

from tests.families import export, logits, reference, tiny, train

pytestmark = pytest.mark.multiprocess


@pytest.mark.parametrize("family", ["deepseek-v3", "glm4-moe", "gpt-oss", "llama4"])
def test_expert_parallelism_computes_what_ep1_computes_and_exports_the_config_model(
    tmp_path, prepared_data, family: str
) -> None:
    model = tiny(family)
    one = train(tmp_path, model, prepared_data, "ep1", "--ep", "1")
    two = train(tmp_path, model, prepared_data, "ep2", "--ep", "2")
    assert two.summary["losses"] == pytest.approx(one.summary["losses"], rel=1e-5, abs=1e-5)
    predicted = two.summary["predicted"]["params_per_rank"]
    for rank in two.summary["params_on_rank"]:
        assert rank["expert"] == predicted["expert"] > 0 and rank["dense"] == predicted["dense"]
    exported = logits(export(tmp_path, model, "ep2"))
    assert torch.allclose(exported, logits(export(tmp_path, model, "ep1")), atol=1e-5, rtol=1e-5)
    assert torch.allclose(exported, logits(reference(model, tmp_path, "ep1")), atol=1e-5, rtol=1e-5)
    if family == "deepseek-v3":  # ZeRO-3 builds under zero.Init: compared with ep 1 at ZeRO-3
        stage3 = [train(tmp_path, model, prepared_data, f"ep{ep}-zero3", "--ep", str(ep), "--zero-stage", "3")
                  for ep in (1, 2)]  # fmt: skip
        assert stage3[1].summary["losses"] == pytest.approx(stage3[0].summary["losses"], rel=1e-5, abs=1e-5)
