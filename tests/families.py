"""What the family tests share: a tiny model of a family trained on 2 gloo ranks through `dstk launch`, exported,
and the export compared with the model transformers builds from the family's own config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli import REPO, dstk
from tests.distributed import Job, config, launch

MODELS = REPO / "tests" / "models"
STEPS = 4


def tiny(family: str) -> str:
    """The folder holding a tiny `config.json` of the family, as a user brings one (`--model <folder>`)."""
    return str(MODELS / f"tiny-{family}")


def train(tmp_path: Path, model: str, data: Path, name: str, *layout: str) -> Job:
    """`STEPS` steps of ZeRO-2 in fp32 (unless `layout` says otherwise), micro-batch 2 on 2 ranks, with a
    checkpoint at the end."""
    cfg = config(
        tmp_path / f"{name}.json", "--model", model, "--zero-stage", "2", "--micro-batch", "2",
        "--global-batch", "4", "--lr", "3e-3", "--train-steps", str(STEPS), "--warmup-steps", "1",
        "--log-dir", str(tmp_path / f"logs-{name}"), *layout,
    )  # fmt: skip
    args = ["--model", model, "--data", str(data), "--steps", str(STEPS), "--log-every", "1"]
    job = launch(tmp_path / name, cfg, [*args, "--checkpoint-dir", str(tmp_path / f"ckpt-{name}")])
    assert job.code == 0, job.output[-4000:]
    return job


def export(tmp_path: Path, model: str, name: str) -> Any:
    """`dstk export` of the run's last checkpoint, loaded back with `from_pretrained`."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / f"hf-{name}"
    result = dstk(
        "export", "--model", model, "--checkpoint", str(tmp_path / f"ckpt-{name}"), "--out", str(out)
    )
    assert result.code == 0, result.err
    return AutoModelForCausalLM.from_pretrained(out).eval()


def reference(model: str, tmp_path: Path, name: str) -> Any:
    """transformers' own model from the family's config.json, with DeepSpeed's consolidated fp32 weights of the
    run's last (ZeRO-1/2/3) checkpoint."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM

    from toolkit.run.checkpoint import complete_tags

    cfg = json.loads((Path(model) / "config.json").read_text())
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=torch.float32).eval()
    ckpt = tmp_path / f"ckpt-{name}"
    state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=next(iter(complete_tags(ckpt))))
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    hf.tie_weights()
    return hf


def logits(model: Any) -> Any:
    """Logits of two sequences of 48 tokens: longer than the tiny configs' windows and attention chunks."""
    import torch

    with torch.no_grad():
        return model(input_ids=torch.arange(96).reshape(2, 48) % 512).logits
