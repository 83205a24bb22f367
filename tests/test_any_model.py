"""Any model transformers builds is a model description: every model type of its causal-LM mapping is priced.

The list is transformers' own `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, not a hand-kept one. Each model type's
default config is written as a `config.json` and priced by `dstk estimate` — through the family table where
dstk has an entry, by tracing the model built on the meta device otherwise — and the estimate's parameter
count must equal the meta-built model's. A model type left out says why, and the reason is checked: a wrapper
of a language model with its own model type (an image-text model's `text_config`) is refused in one line, and a
default config transformers itself cannot build still cannot be built (if a new transformers builds it, this
test fails until it is priced).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.cli import dstk

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

CANNOT_BUILD = {
    # transformers 5.25's own default configs that its classes refuse or cannot build from
    "cohere_compass_text": "full_attention",
    "dbrx": "rope_theta",
    "dots1": "empty()",
    "gemma4_assistant": "hidden_size_per_layer_input",
    "hunyuan_v1_dense": "unsupported operand",
    "hunyuan_v1_moe": "unsupported operand",
    "lfm2_moe": "not subscriptable",
    "ministral": "unsupported operand",
    "musicgen": "dropout",
    "musicgen_melody": "dropout",
    "nemotron": "unsupported operand",
    "qwen4_exp_text": "unsupported operand",
    "reformer": "is_decoder=True",
}
"""Model types whose default config transformers cannot build a causal LM from: left out because of the
model's own defaults (the value is a fragment of the error transformers raises)."""


def _default_config(model_type: str) -> dict:
    return AutoConfig.for_model(model_type).to_dict()


def _meta_count(model_type: str) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
def test_every_causal_lm_model_type_is_priced(model_type: str, tmp_path: Path) -> None:
    if model_type in CANNOT_BUILD:
        with pytest.raises(Exception, match=re.escape(CANNOT_BUILD[model_type])):
            _meta_count(model_type)
        return
    config = _default_config(model_type)
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    result = dstk("estimate", "--model", str(folder), "--cluster", "dgx-h100", "--nodes", "8", "--json")
    if "text_config" in config:
        # an image-text (or audio-text) model: its language model has a model_type of its own
        assert result.code == 2 and "image-text model" in result.err and "\n" not in result.err.strip()
        return
    assert result.code == 0, result.err
    priced = json.loads(result.out)
    assert priced["n_params"] == _meta_count(model_type)
    assert 0 < priced["n_active_params"] <= priced["n_params"]
    assert math.isfinite(priced["step_time_s"]) and priced["step_time_s"] > 0
    assert priced["memory_per_gpu_bytes"]["total"] > 0 and priced["model_flops_per_token"] > 0
