"""What a resume will meet, judged from checkpoint manifests before any rank starts (toolkit/run/preflight.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.errors import UserError
from toolkit.run.preflight import check_resume

LAYOUT = {"zero_stage": 2, "tp": 1, "pp": 1, "ep": 1, "sp": 1}
MODEL = {"name": "tiny", "n_layers": 2, "hidden_size": 64}


def _checkpoint(root: Path, step: int, **manifest: object) -> Path:
    tag = root / f"step{step:08d}"
    tag.mkdir(parents=True)
    data = {"tag": tag.name, "step": step, "world_size": 2, "files": {}, "layout": LAYOUT, "model": MODEL}
    (tag / "dstk_manifest.json").write_text(json.dumps({**data, **manifest}))
    return root


def test_a_resume_that_will_work_passes_and_nothing_to_resume_is_fine(tmp_path: Path) -> None:
    root = _checkpoint(tmp_path / "ckpt", 10)
    check_resume(root, "auto", 20, 2, LAYOUT, MODEL)
    check_resume(tmp_path / "empty", "auto", 20, 2, LAYOUT, MODEL)
    check_resume(root, "never", 5, 8, {**LAYOUT, "zero_stage": 3}, MODEL)


def test_each_mismatch_is_one_line_with_its_fix(tmp_path: Path) -> None:
    root = _checkpoint(tmp_path / "ckpt", 10)
    cases = [
        ((root, "auto", 10, 2, LAYOUT, MODEL), r"at step 10 already, so --steps 10 leaves nothing"),
        ((root, "auto", 20, 4, LAYOUT, MODEL), r"written by 2 ranks and this job has 4; convert it first"),
        ((root, "auto", 20, 2, {**LAYOUT, "zero_stage": 3}, MODEL), r"zero_stage 2 → 3\); convert it first"),
        ((root, "auto", 20, 2, LAYOUT, {**MODEL, "hidden_size": 128}), r"hidden_size differ from tiny"),
        ((root, "step00000007", 20, 2, LAYOUT, MODEL), r"no such checkpoint\); complete ones: step00000010"),
    ]
    for args, pattern in cases:
        with pytest.raises(UserError, match=pattern) as err:
            check_resume(*args)
        assert "\n" not in str(err.value)


def test_a_converted_checkpoint_resumes_anywhere(tmp_path: Path) -> None:
    root = _checkpoint(tmp_path / "ckpt", 10, universal=True)
    check_resume(root, "auto", 20, 8, {**LAYOUT, "zero_stage": 3}, MODEL)


def test_relative_monitor_paths_land_under_the_run_directory(tmp_path: Path) -> None:
    from toolkit.run.session import _monitors_under

    cfg = {
        "tensorboard": {"enabled": True, "output_path": "logs/tensorboard"},
        "csv_monitor": {"enabled": True, "output_path": "/abs/csv"},
        "train_batch_size": 8,
    }
    out = _monitors_under(cfg, tmp_path / "run")
    assert out["tensorboard"]["output_path"] == str(tmp_path / "run" / "logs" / "tensorboard")
    assert out["csv_monitor"]["output_path"] == "/abs/csv" and out["train_batch_size"] == 8
    assert cfg["tensorboard"]["output_path"] == "logs/tensorboard"  # the caller's config is not changed


def test_grow_replans_at_the_batch_the_parent_trained_with(tmp_path: Path) -> None:
    from toolkit.commands.grow import _at_the_trained_batch
    from toolkit.plan.query import PlanQuery

    tag = _checkpoint(tmp_path / "ckpt", 10, layout={**LAYOUT, "global_batch_size": 16}) / "step00000010"
    assert _at_the_trained_batch(PlanQuery(), tag).global_batch_size == 16
    assert _at_the_trained_batch(PlanQuery(global_batch_size=64), tag).global_batch_size == 64
    assert (
        _at_the_trained_batch(PlanQuery(), tmp_path).global_batch_size is None
    )  # save_pretrained: no record


def test_a_busy_port_is_replaced_or_named_before_any_rank_starts(tmp_path: Path) -> None:
    """A port bound by another program, or reserved by another dstk launch on this host (whose ranks have
    not bound it yet), is refused when named and replaced when it was the default; the reservation is held
    until released."""
    import socket

    from toolkit.launcher.lock import reserve_port
    from toolkit.run.launching import rendezvous_port as _rendezvous_port

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"--master-port: {port} is in use on this host .another program"):
            _rendezvous_port(port, probe=True)
        free, lock = _rendezvous_port(None, probe=True)  # 29500, or a free one if that is busy
        assert free != port and lock is not None
        # a multi-node rendezvous is not this host's to probe
        assert _rendezvous_port(port, probe=False) == (port, None)
    # the port is free now, but reserved: another launch is refused it, or sent elsewhere
    assert "another dstk job holds it" in reserve_port(free, "other-job")
    with pytest.raises(UserError, match=f"--master-port: {free} is in use on this host .another dstk job"):
        _rendezvous_port(free, probe=True)
    lock.release()
    again = reserve_port(free)
    assert not isinstance(again, str)
    again.release()


def test_json_outputs_are_strict_and_the_jit_build_is_known(tmp_path: Path) -> None:
    from toolkit.launcher.job import built_op
    from toolkit.run.metrics import strict_json

    assert json.loads(strict_json({"loss": float("nan"), "steps": [1.0, float("inf")]})) == {
        "loss": None,
        "steps": [1.0, None],
    }
    (tmp_path / "deepspeed_shm_comm").mkdir()
    assert not built_op("deepspeed_shm_comm", {"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    (tmp_path / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"")
    assert built_op("deepspeed_shm_comm", {"TORCH_EXTENSIONS_DIR": str(tmp_path)})


DATA = {"tokenizer_hash": "f450e47e8486146a", "seq_length": 64, "vocab_size": 512, "rows": 996, "path": "/a"}


def test_a_resume_onto_other_data_is_refused_unless_asked(tmp_path: Path) -> None:
    """The checkpoint's manifest records the data it was trained on: another tokenizer, packing or dataset is
    refused in one line (`--new-data` continues the model on it); the same data under another path is fine."""
    root = _checkpoint(tmp_path / "ckpt", 10, data=DATA)
    check_resume(root, "auto", 20, 2, LAYOUT, MODEL, {**DATA, "path": "/elsewhere"})
    for changed, pattern in [
        ({"tokenizer_hash": "0123456789abcdef"}, r"tokenizer_hash f450e47e8486146a → 0123456789abcdef"),
        ({"seq_length": 128}, r"seq_length 64 → 128"),
        ({"rows": 10}, r"rows 996 → 10"),
    ]:
        with pytest.raises(UserError, match=rf"^--data: .*other data \({pattern}\).*--new-data") as err:
            check_resume(root, "auto", 20, 2, LAYOUT, MODEL, {**DATA, **changed})
        assert "\n" not in str(err.value)
        check_resume(root, "auto", 20, 2, LAYOUT, MODEL, {**DATA, **changed}, new_data=True)


def test_steps_past_the_schedule_are_said_and_within_it_are_not() -> None:
    from toolkit.run.preflight import schedule_note

    cfg = {"scheduler": {"params": {"total_num_steps": 100, "cos_min_ratio": 0.1}}}
    assert schedule_note(100, cfg) is None and schedule_note(50, cfg) is None
    note = schedule_note(200, cfg)
    assert (
        note is not None and "steps 101–200 train at 0.1 × the peak" in note and "--train-steps 200" in note
    )
    assert schedule_note(200, {}) is None  # no schedule: nothing assumed


def test_a_checkpoint_folder_is_told_from_one_checkpoint(tmp_path: Path) -> None:
    from toolkit.run.preflight import pick_checkpoint

    root = _checkpoint(tmp_path / "ckpt", 10)
    assert pick_checkpoint(root, None) == "step00000010"
    with pytest.raises(
        UserError,
        match=r"is one checkpoint, not a folder of them; give --checkpoint .*ckpt --tag step00000010",
    ):
        pick_checkpoint(root / "step00000010", None)
    with pytest.raises(
        UserError, match=r"^--tag: .* has no checkpoint step00000099; complete ones: step00000010"
    ):
        pick_checkpoint(root, "step00000099")
    with pytest.raises(UserError, match=r"^--checkpoint: .*absent not found"):
        pick_checkpoint(tmp_path / "absent", None)
