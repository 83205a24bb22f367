"""A run's outputs are never clobbered (#46): a folder belongs to one job (lock files naming their holder,
stale ones taken over), a checkpoint folder is resumed or explicitly started over, an earlier run's records
are set aside, and a verb that fills a folder refuses one that holds files. Every verb refusing a folder another
job holds is in the bad-input catalogue (tests/test_bad_inputs.py); the two-jobs-one-folder and
relaunch-without-resume cases also run for real, with 2 ranks, in tests/test_zero_runs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.cli import REPO, dstk
from toolkit.errors import UserError
from toolkit.launcher.lock import LOCK_NAME, Holder, Lock, claim_folder, lock_folder, stale_note, try_lock
from toolkit.run.folders import check_checkpoint_dir, remove_checkpoints, set_aside_records

TINY = str(REPO / "tests" / "models" / "tiny-test-gpt2.yaml")


def test_a_held_folder_is_refused_naming_its_holder_and_a_dead_holders_lock_is_taken_over(tmp_path) -> None:
    """Another process holds the lock: refused with its pid and command. It dies without releasing (SIGKILL):
    the next job takes the lock over and says whose it was. A release removes the file."""
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from toolkit.launcher.lock import "
         "lock_folder; lock_folder(Path(sys.argv[1]), '--run-dir'); print('held', flush=True); time.sleep(60)",
         str(folder)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.time()
        with pytest.raises(
            UserError, match=rf"--run-dir: {folder} is in use by another job: pid {holder.pid} on "
        ):
            lock_folder(folder, "--run-dir")
        assert time.time() - start < 1.0
        assert isinstance(try_lock(folder / LOCK_NAME, "not-its-token"), Holder)
    finally:
        holder.kill()
        holder.wait()
    taken = lock_folder(folder, "--run-dir")
    note = stale_note("--run-dir", taken)
    assert note and f"from a job that is gone (pid {holder.pid} on " in note
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    taken.release()
    assert not (folder / LOCK_NAME).exists()
    again = lock_folder(folder, "--run-dir")  # released cleanly: nothing stale to say
    assert stale_note("--run-dir", again) is None
    again.release()


def test_a_rank_of_the_launching_job_shares_its_launchers_lock(tmp_path) -> None:
    """dstk launch holds the folders under a token its ranks inherit: the ranks' own claim is then no claim."""
    mine = try_lock(tmp_path / LOCK_NAME, "job-token")
    assert isinstance(mine, Lock) and mine.fd is not None
    shared = try_lock(tmp_path / LOCK_NAME, "job-token")
    assert isinstance(shared, Lock) and shared.fd is None
    assert isinstance(try_lock(tmp_path / LOCK_NAME, "other-token"), Holder)
    mine.release()


def test_a_checkpoint_folder_is_resumed_or_started_over_never_written_over(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    assert check_checkpoint_dir(ckpt, "never", False) is None  # nothing there yet
    for tag in ("step00000050", "step00000100"):
        (ckpt / tag).mkdir(parents=True)
        (ckpt / tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
    with pytest.raises(
        UserError, match=r"holds checkpoints \(step00000100, step00000050\) and --resume is never"
    ):
        check_checkpoint_dir(ckpt, "never", False)
    assert check_checkpoint_dir(ckpt, "auto", False) is None
    note = check_checkpoint_dir(ckpt, "never", True)
    assert note and f"step00000100, step00000050 in {ckpt} will be removed before step 1" in note
    with pytest.raises(UserError, match="--overwrite-checkpoints: starts over from step 0, --resume auto"):
        check_checkpoint_dir(ckpt, "auto", True)
    (ckpt / "latest_complete").write_text("step00000100\n")
    (ckpt / "notes.txt").write_text("mine")
    assert remove_checkpoints(ckpt) == ["step00000100", "step00000050"]
    assert sorted(p.name for p in ckpt.iterdir()) == ["notes.txt"]  # the user's own file stays


def test_a_fresh_run_sets_an_earlier_runs_records_aside(tmp_path) -> None:
    """A run that starts at step 0 in a run folder with another run's metrics would append to them (duplicate
    steps): they move to RUN_DIR/earlier/<time>/, said once; the run's data and other files stay."""
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "summary.json").write_text("{}")
    note = set_aside_records(run)
    assert note and "an earlier run's metrics.jsonl, summary.json moved to" in note
    moved = next((run / "earlier").iterdir())
    assert sorted(p.name for p in moved.iterdir()) == ["metrics.jsonl", "summary.json"]
    assert sorted(p.name for p in run.iterdir()) == ["data", "earlier"]
    assert set_aside_records(run) is None


def test_a_verb_fills_only_an_empty_folder_unless_told_to_overwrite(tmp_path) -> None:
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "mine.txt").write_text("the user's")
    with pytest.raises(UserError, match=r"--out: .*corpus already holds files \(mine.txt\); give an empty"):
        claim_folder(out, "--out", False, "the corpus")
    claim_folder(out, "--out", True, "the corpus").release()
    r = dstk("data", "generate", "--out", str(out), "--docs-per-domain", "2", "--overwrite")
    assert r.code == 0, r.err
    assert sorted(p.name for p in out.iterdir()) == ["books.jsonl", "code.jsonl", "mine.txt", "web.jsonl"]
    assert (out / "mine.txt").read_text() == "the user's"


def test_save_every_and_keep_last_zero_mean_what_their_help_says() -> None:
    text = " ".join(dstk("train", "--help").out.split())
    assert "0: only at the end" in text and "0: keep every one" in text
    assert "(default: never)" in text  # --resume's default, said


def test_the_pre_flight_knows_the_data_against_the_job(tmp_path) -> None:
    """Rows against one global batch (refused when fewer), how often --steps reads the data, the data's
    sequence length against the model's (the summary prices the data's): from the manifest, before torch."""
    from toolkit.plan.load import load_model
    from toolkit.run.data_fit import at_seq_length, check_rows, epochs_note, seq_length_note

    manifest = {"rows": {"train": 996}, "seq_length": 64}
    with pytest.raises(
        UserError, match=r"--data: d holds 996 training sequences, fewer than one global batch of 1024"
    ):
        check_rows("d", manifest, 1024, token_budget=False)
    check_rows("d", manifest, 1024, token_budget=True)  # rows per step vary: nothing to compare
    note = epochs_note(manifest, 8, 300, False)
    assert (
        note
        and "reads the data 2.4 times: 996 training sequences make 124 steps of 8, so from step 125" in note
    )
    assert epochs_note(manifest, 8, 124, False) is None
    model = load_model(TINY)
    assert seq_length_note(model, manifest) is None
    longer = at_seq_length(model, 128)
    note = seq_length_note(longer, manifest)
    assert note and "its sequences are 64 tokens and tiny-test-gpt2's seq_length is 128" in note
    assert at_seq_length(longer, 64).seq_length == 64 and at_seq_length(model, 64) is model


def test_the_slurm_lead_and_the_time_warning_come_from_the_plan(tmp_path) -> None:
    """llama-13b on 2 DGX A100 (the issue's plan): a step of ~29.5 s and a save of ~18 s give a lead past
    DeepSpeed's 30 s kill window, and 2 days of --time against the plan's ~98 days is said with the number of
    runs the job will requeue itself through."""
    from types import SimpleNamespace

    from toolkit.plan.load import load_cluster, load_model
    from toolkit.run.slurm_job import lead_and_warning, timing

    cfg = tmp_path / "l13.json"
    r = dstk("config", "--plan", "--model", "llama-13b", "--cluster", "dgx-a100-80g", "--nodes", "2",
             "--global-batch", "256", "--tokens", "300B", "-o", str(cfg))  # fmt: skip
    assert r.code == 0, r.err
    config = json.loads(cfg.read_text())
    cluster = load_cluster("dgx-a100-80g", {"nodes": 2})
    steps = config["scheduler"]["params"]["total_num_steps"]
    train = SimpleNamespace(model=load_model("llama-13b"), config=config, cluster=cluster, data=None,
                            loop=SimpleNamespace(steps=steps))  # fmt: skip
    step_s, save_s = timing(train, cluster)
    assert 25 < step_s < 35 and 10 < save_s < 30
    lead, warning = lead_and_warning(train, cluster, "2-00:00:00")
    assert lead > 2 * step_s + save_s and lead > 30
    assert (
        warning and "exceed --time 2-00:00:00: each run checkpoints" in warning and "runs in all" in warning
    )
    assert "days" in warning.split("(")[0]
    assert lead_and_warning(train, cluster, None)[1] is None


def test_byte_order_marks_and_utf16_are_read(tmp_path) -> None:
    """A description saved by a Windows editor (UTF-8 with a BOM, or Notepad's UTF-16) reads as UTF-8 does; a
    BOM at the head of a JSONL corpus no longer costs its first record."""
    text = (REPO / "tests" / "models" / "tiny-test-gpt2.yaml").read_text()
    for name, data in (("bom.yaml", b"\xef\xbb\xbf" + text.encode()), ("u16.yaml", text.encode("utf-16"))):
        (tmp_path / name).write_bytes(data)
        r = dstk("estimate", "--model", str(tmp_path / name), "--cluster", "cpu", "--json")
        assert r.code == 0 and json.loads(r.out)["n_params"] > 0, r.err
    from toolkit.data.formats import PieceReport, Source, _record

    source = Source(path=str(tmp_path / "c.jsonl"), kind="lines", json=True, domain="web")
    record = _record(b'\xef\xbb\xbf{"text": "first"}\n', source, ("text", "domain"), PieceReport())
    assert record is not None and record.text == "first"
