"""Secrets in the environment never reach a generated file or a log, and values that reach a shell are checked."""

from __future__ import annotations

import json
import os

from tests.cli import dstk

SECRETS = {
    "WANDB_API_KEY": "wandb-secret-0123456789",
    "HF_TOKEN": "hf_secret_abcdef",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-xyz",
}


def test_no_secret_in_generated_files(tmp_path, monkeypatch) -> None:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    cfg = tmp_path / "ds.json"
    assert dstk("config", "--model", "tiny-gpt2", "--cluster", "cpu", "--wandb", "-o", str(cfg)).code == 0
    assert (
        dstk(
            "plan",
            "--model",
            "tiny-gpt2",
            "--cluster",
            "cpu",
            "--report",
            str(tmp_path / "plan.md"),
            "--json",
        ).code
        == 0
    )
    r = dstk(
        "launch",
        "--cluster",
        "cpu",
        "--config",
        str(cfg),
        "--run-dir",
        str(tmp_path / "launch"),
        "--dry-run",
        "--",
        "--model",
        "tiny-gpt2",
    )
    assert r.code == 0
    env = dstk("env", "--json")
    written = [p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*") if p.is_file()]
    written += [r.out, env.out]
    for text in written:
        for secret in SECRETS.values():
            assert secret not in text
    assert json.loads(cfg.read_text())["wandb"] == {"enabled": True, "project": "dstk"}


def test_environment_is_not_mutated_by_the_pure_verbs(monkeypatch) -> None:
    before = dict(os.environ)
    dstk("plan", "--model", "gpt2", "--cluster", "dgx-h100")
    assert dict(os.environ) == before
