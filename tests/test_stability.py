"""The spike guard: the detector's rule without processes, the CLI's checks in-process, and the acceptance on
real 2-rank DeepSpeed runs (ZeRO-0 fp32 with a torch AdamW, the case where the engine reports no gradient
norm and dstk computes it).

The runs share one module-scoped fixture: a clean run, a guarded run with two injected faults (a NaN loss at
step 12, an unclipped ×1e4 gradient at step 24; see toolkit.run.stability.Fault for why unclipped), and each fault
without the guard.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.cli import dstk
from tests.conftest import train_args, zero_config
from tests.distributed import LAUNCH_SLOTS, TEST_MODEL, launch
from toolkit.errors import UserError
from toolkit.run.stability import MIN_HISTORY, Fault, GuardOptions, RobustBaseline, SpikeDetector

# --- the detector, pure --------------------------------------------------------------------------------------


def _detector(**kw) -> SpikeDetector:
    return SpikeDetector(GuardOptions(**kw))


def _feed(det: SpikeDetector, losses: list[float], first_step: int = 1, grad_norm: float | None = 1.0):
    return [det.observe(first_step + i, loss, grad_norm) for i, loss in enumerate(losses)]


def _steady(n: int) -> list[float]:
    """A flat loss with a small deterministic wiggle: median 2.0, MAD 0.01."""
    return [2.0 + 0.01 * ((i % 3) - 1) for i in range(n)]


def test_baseline_is_median_plus_k_mads_and_ignores_one_outlier() -> None:
    b = RobustBaseline(window=10, values=[1.0, 2.0, 3.0, 4.0, 100.0])
    assert b.stats() == (3.0, 1.0)
    assert b.limit(6) == 9.0
    b = RobustBaseline(window=3, values=[5.0, 6.0, 7.0, 8.0])  # the window keeps the last three
    assert list(b.values) == [6.0, 7.0, 8.0]


def test_flat_signal_is_judged_against_a_floored_mad() -> None:
    b = RobustBaseline(window=10, values=[2.0] * 10)
    assert b.limit(6) == pytest.approx(2.0 + 6 * 2e-3)


def test_rules_are_armed_only_after_enough_history() -> None:
    early = _feed(_detector(), [2.0] * (MIN_HISTORY - 1) + [50.0])
    assert not any(v.suspect for v in early)  # four values are no baseline
    armed = _feed(_detector(), [2.0] * MIN_HISTORY + [50.0])
    assert not any(v.suspect for v in armed[:-1]) and armed[-1].suspect


def test_a_falling_loss_never_triggers() -> None:
    det = _detector(window=20)
    losses = [6.0 * math.exp(-i / 40) + 0.02 * ((i * 7) % 5 - 2) for i in range(300)]
    assert not any(v.suspect for v in _feed(det, losses))


def test_spike_needs_patience_consecutive_anomalous_steps() -> None:
    det = _detector(window=20, patience=3)
    assert not any(v.suspect for v in _feed(det, _steady(20)))
    two = _feed(det, [5.0, 5.0], first_step=21)
    assert [(v.spike, v.suspect, v.episode_start) for v in two] == [(False, True, 21), (False, True, 21)]
    quiet = _feed(det, _steady(3), first_step=23)
    assert [v.suspect for v in quiet] == [True, True, False]  # the episode closes after 3 clear steps
    three = _feed(det, [5.0, 5.0, 5.0], first_step=26)
    assert [v.spike for v in three] == [False, False, True]
    assert three[-1].episode_start == 26 and "3 anomalous step(s) in a row" in three[-1].reason


def test_anomalous_values_stay_out_of_the_baseline() -> None:
    det = _detector(window=20, patience=5)
    _feed(det, _steady(20))
    before = det.baselines["loss"].stats()
    _feed(det, [9.0] * 4, first_step=21)
    assert det.baselines["loss"].stats() == before


def test_episode_start_survives_a_quiet_step() -> None:
    """A wild step, one quiet step, then a sustained rise: the rollback must go back before the wild step."""
    det = _detector(window=20, patience=3)
    _feed(det, _steady(20))
    det.observe(21, 2.0, 1e4)  # an unclipped gradient: only the norm shows it
    det.observe(22, 2.0, 1.0)
    verdicts = _feed(det, [5.0, 5.0, 5.0], first_step=23)
    assert verdicts[-1].spike and verdicts[-1].episode_start == 21


@pytest.mark.parametrize(
    ("loss", "grad_norm"), [(math.nan, 1.0), (math.inf, 1.0), (2.0, math.nan), (2.0, math.inf)]
)
def test_a_non_finite_loss_or_grad_norm_is_a_spike_at_once(loss: float, grad_norm: float) -> None:
    det = _detector()
    v = det.observe(1, loss, grad_norm)  # even with no history yet
    assert v.spike and v.episode_start == 1 and "non-finite" in v.reason


def test_grad_norm_rule_is_off_when_the_norm_is_unknown() -> None:
    det = _detector(window=20)
    _feed(det, _steady(20), grad_norm=None)
    assert not det.observe(21, 2.0, None).suspect
    assert len(det.baselines["grad_norm"].values) == 0


def test_detector_baselines_survive_a_checkpoint_round_trip() -> None:
    """A resumed run judges its first steps against the saved baselines instead of starting unarmed."""
    det = _detector(window=20)
    _feed(det, _steady(20))
    state = json.loads(json.dumps(det.state()))  # it travels in the checkpoint manifest
    again = _detector(window=20)
    again.load_state(state)
    assert again.baselines["loss"].stats() == det.baselines["loss"].stats()
    assert again.observe(21, 5.0, 1.0).suspect


@pytest.mark.parametrize(
    ("kw", "flag"),
    [
        ({"window": 2}, "--spike-window"),
        ({"mads": 0}, "--spike-mads"),
        ({"patience": 0}, "--spike-steps"),
        ({"lr_factor": 1.5}, "--spike-lr-factor"),
        ({"lr_factor": 0}, "--spike-lr-factor"),
        ({"max_rollbacks": -1}, "--max-rollbacks"),
    ],
)
def test_guard_options_name_the_flag_to_fix(kw: dict, flag: str) -> None:
    with pytest.raises(UserError, match=f"^{flag}: "):
        GuardOptions(**kw)


def test_fault_is_tied_to_the_data_or_persistent() -> None:
    f = Fault.parse("12:nan")
    assert (f.step, f.kind, f.persistent) == (12, "nan", False)
    assert f.fires(12, 88, 8) and f.fires(9, 88, 8)  # the rows of step 12, whatever the step is called now
    assert not f.fires(12, 96, 8)  # a rollback skipped them: it never fires again
    p = Fault.parse("3+:spike")
    assert p.persistent and p.fires(3, 0, 8) and p.fires(7, 999, 8) and not p.fires(2, 16, 8)
    for bad in ("12", "x:nan", "0:nan", "12:boom", "-1:nan"):
        with pytest.raises(UserError, match=r"^--inject-fault: "):
            Fault.parse(bad)


# --- the CLI's checks, in-process (nothing is launched) --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--spike-guard"], "--spike-guard: needs --checkpoint-dir"),
        (["--spike-guard", "--checkpoint-dir", "CKPT", "--save-every", "0"], "--spike-guard: needs periodic"),
        (["--spike-mads", "4"], "--spike-mads: only applies with --spike-guard"),
        (["--max-rollbacks", "2"], "--max-rollbacks: only applies with --spike-guard"),
        (
            ["--spike-guard", "--checkpoint-dir", "CKPT", "--save-every", "2", "--spike-steps", "0"],
            "--spike-steps: must be at least 1",
        ),
        (["--inject-fault", "soon:nan"], "--inject-fault: expected STEP"),
    ],
)
def test_train_rejects_bad_guard_flags(tmp_path: Path, args: list[str], message: str) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 8}))
    args = [a.replace("CKPT", str(tmp_path / "ckpt")) for a in args]
    r = dstk("train", "--model", TEST_MODEL, "--config", str(cfg), "--steps", "5", *args)
    assert r.code == 2 and message in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1


# --- acceptance: real processes --------------------------------------------------------------------------------

STEPS = 36
NAN_STEP, SPIKE_STEP = 12, 24
GLOBAL_BATCH = 8  # zero_config's
FAULTS = {"nan": ["--inject-fault", f"{NAN_STEP}:nan"], "spike": ["--inject-fault", f"{SPIKE_STEP}:spike"]}


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _finished(job) -> bool:
    """Exit 0, or gloo's occasional abort after a run that wrote its summary (see toolkit.run.runtime.shutdown)."""
    aborted = "terminate called without an active exception" in job.output
    return job.code == 0 or (aborted and (job.run_dir / "summary.json").is_file())


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prepared_data) -> dict:
    """Five 2-rank jobs, LAUNCH_SLOTS at a time (the launcher chain is mostly single-threaded start-up)."""
    root = tmp_path_factory.mktemp("stability")
    cfg = zero_config(root / "z0.json", 0, "--train-steps", str(STEPS))
    common = train_args(prepared_data, STEPS, "--eval-every", str(STEPS))
    guard = [
        "--checkpoint-dir",
        str(root / "ckpt"),
        "--save-every",
        "4",
        "--spike-guard",
        "--max-rollbacks",
        "5",
    ]
    # a fault on every step from 4 on: no data skip escapes it; the one rollback allowed lowers the rate
    budget = ["--checkpoint-dir", str(root / "ckpt-budget"), "--save-every", "2", "--spike-guard"]
    budget += ["--max-rollbacks", "1", "--spike-lr-factor", "0.5", "--inject-fault", "4+:nan"]
    variants = {
        "clean": common,
        "guarded": common + guard + FAULTS["nan"] + FAULTS["spike"],
        "nan_unguarded": common + FAULTS["nan"],
        "spike_unguarded": common + FAULTS["spike"],
        "budget": train_args(prepared_data, 8, *budget),
    }
    with ThreadPoolExecutor(max_workers=LAUNCH_SLOTS) as pool:
        futures = {name: pool.submit(launch, root / name, cfg, args) for name, args in variants.items()}
        jobs = {name: f.result() for name, f in futures.items()}
    for name, job in jobs.items():
        assert name == "budget" or _finished(job), (name, job.output[-4000:])
    return jobs


def _final_eval(job) -> float:
    evals = job.summary["evals"]
    assert evals[-1]["step"] == STEPS
    return evals[-1]["loss"]


def _covers(event: dict, step: int) -> bool:
    """Whether the rollback skipped the rows of step `step` of an uninterrupted run."""
    start, end = event["skipped_rows"]
    return start <= (step - 1) * GLOBAL_BATCH and step * GLOBAL_BATCH <= end


@pytest.mark.multiprocess
def test_guard_rolls_back_skips_the_bad_data_and_ends_near_the_clean_run(runs) -> None:
    clean, guarded = runs["clean"], runs["guarded"]
    events = _read_jsonl(guarded.run_dir / "events.jsonl")
    assert events and all(e["action"] == "rollback" for e in events), events
    first = events[0]
    assert first["step"] == NAN_STEP and "non-finite loss" in first["reason"], first
    assert first["rolled_back_to"] < NAN_STEP and _covers(first, NAN_STEP)
    spike = [e for e in events[1:] if _covers(e, SPIKE_STEP)]
    assert spike and "grad_norm" in spike[-1]["reason"], events
    s = guarded.summary
    assert s["final_step"] == STEPS and len(s["losses"]) == STEPS
    assert all(math.isfinite(x) for x in s["losses"]) and math.isfinite(s["param_norm"])
    # nothing changes before the first fault: the guard only watches
    upto = first["rolled_back_to"]
    assert s["losses"][:upto] == clean.summary["losses"][:upto]
    guarded_loss, clean_loss = _final_eval(guarded), _final_eval(clean)
    print(f"final eval loss: clean {clean_loss:.4f}, guarded {guarded_loss:.4f}, rollbacks {len(events)}")
    assert guarded_loss == pytest.approx(clean_loss, rel=0.02)


@pytest.mark.multiprocess
def test_rollbacks_reach_the_metrics_and_the_monitors(runs) -> None:
    guarded = runs["guarded"]
    events = _read_jsonl(guarded.run_dir / "events.jsonl")
    metrics = _read_jsonl(guarded.run_dir / "metrics.jsonl")
    guard_rows = [m for m in metrics if m["split"] == "guard"]
    assert [m["rolled_back_to"] for m in guard_rows] == [e["rolled_back_to"] for e in events]
    train = [m for m in metrics if m["split"] == "train"]
    assert all("grad_norm" in m for m in train)  # computed by dstk: ZeRO-0 with a torch optimizer has none
    assert max(m["grad_norm"] for m in train) > 1e3  # the unclipped ×1e4 gradient was seen
    csv_dir = Path(json.loads((guarded.run_dir.parent / "z0.json").read_text())["csv_monitor"]["output_path"])
    assert any("rolled_back_to" in p.name for p in csv_dir.rglob("*.csv"))  # DeepSpeed's CSV monitor has it


@pytest.mark.multiprocess
def test_without_the_guard_the_faults_ruin_the_run(runs) -> None:
    nan, spike, clean = runs["nan_unguarded"], runs["spike_unguarded"], runs["clean"]
    # NaN weights: summary.json is strict JSON, where a NaN is written as null
    assert nan.summary["param_norm"] is None and _final_eval(nan) is None
    worse, clean_loss = _final_eval(spike), _final_eval(clean)
    print(
        f"without the guard: nan fault -> NaN weights; spike fault final eval {worse:.4f} vs {clean_loss:.4f}"
    )
    assert math.isfinite(spike.summary["param_norm"]) and worse > clean_loss * 1.03
    assert not (nan.run_dir / "events.jsonl").exists()


@pytest.mark.multiprocess
def test_a_run_that_cannot_recover_stops_at_the_rollback_budget(runs) -> None:
    job = runs["budget"]
    assert job.code != 0
    assert "--max-rollbacks: a spike after 1 rollback(s) (non-finite loss (nan) at step 4)" in job.output
    assert not (job.run_dir / "summary.json").exists()
    events = _read_jsonl(job.run_dir / "events.jsonl")
    assert [e["action"] for e in events] == ["rollback", "stop"] and events[0]["rolled_back_to"] == 2
    # step 3 ran twice: before the rollback at the scheduled rate, after it at half that rate
    lrs = [
        m["lr"]
        for m in _read_jsonl(job.run_dir / "metrics.jsonl")
        if m["split"] == "train" and m["step"] == 3
    ]
    assert len(lrs) == 2 and lrs[1] == pytest.approx(lrs[0] * 0.5, rel=1e-12)
