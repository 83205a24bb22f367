"""Dynamic batching (toolkit/data/dynamic.py, toolkit/data/loader.py): `dstk data prepare --no-pack` rows,
token-budget micro-batches, the learning-rate scaling rule, the sequence-length curriculum, determinism,
exact resumption, rank lockstep — and a 2-rank `dstk train --token-budget` run whose loss falls."""

from __future__ import annotations

import itertools
import json
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.cli import REPO
from tests.distributed import TEST_MODEL, config, dstk_cmd, launch
from toolkit.data.corpus import GENERATORS
from toolkit.data.dynamic import (
    Batching,
    Curriculum,
    DynamicOptions,
    Stream,
    dynamic_options,
    lr_factor,
    plan_step,
    resolve,
    scheduled_lrs,
    set_lrs,
)
from toolkit.data.loader import DynamicLoader, TrainLoader, VariableData, load_split
from toolkit.data.options import PrepareOptions, QualityFilter
from toolkit.data.pack import piece_chunks
from toolkit.data.prepare import prepare, split_order
from toolkit.data.tokenizer import load_tokenizer
from toolkit.errors import UserError
from toolkit.run.checkpoint import tag_for

SEQ = 64


def skewed_texts(n: int, seed: int) -> list[str]:
    """Documents of 1 to 12 demo-corpus sentences, lognormally many: mostly one or two (shorter than a
    64-token sequence), a long tail cut into several pieces."""
    rng = random.Random(seed)
    makers = [GENERATORS["web"], GENERATORS["books"]]
    return [
        " ".join(rng.choice(makers)(rng) for _ in range(min(12, 1 + int(rng.lognormvariate(0, 1.0)))))
        for _ in range(n)
    ]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory) -> Path:
    """1,500 skewed documents through the CLI with --no-pack: 64-token rows, vocabulary 512."""
    root = tmp_path_factory.mktemp("dyn")
    raw = write_jsonl(root / "raw" / "docs.jsonl", skewed_texts(1500, 0))
    proc = subprocess.run(
        dstk_cmd(
            "data", "prepare", "--input", str(raw), "--out", str(root / "out"), "--seq-length", str(SEQ),
            "--train-tokenizer", "512", "--no-pack", "--max-repetition", "1",
        ),
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "of up to 64 tokens" in proc.stdout
    return root / "out"


def batching(**kw) -> Batching:
    args = dict(
        micro_batches=4, gradient_accumulation=2, seq_length=SEQ, reference_tokens=8 * SEQ,
        rows_per_micro_batch=2, token_budget=256, seed=0,
    )  # fmt: skip
    return Batching(**{**args, **kw})


# --- preparing variable-length rows ------------------------------------------------------------------------


def test_pieces_keep_document_boundaries_and_every_token() -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 100, rng.integers(0, 30)).tolist() for _ in range(300)]
    chunks = list(piece_chunks(docs, 8, eos=0, rows_per_chunk=5))
    tokens = np.concatenate([t for t, _ in chunks])
    lengths = np.concatenate([n for _, n in chunks])
    assert tokens.tolist() == [t for d in docs for t in [*d, 0]]  # every token, each document closed by eos
    assert lengths.max() == 8 and lengths.min() >= 1 and lengths.sum() == len(tokens)
    expected = [
        n for d in docs for n in [8] * ((len(d) + 1) // 8) + ([(len(d) + 1) % 8] * bool((len(d) + 1) % 8))
    ]
    assert lengths.tolist() == expected  # a row never mixes two documents


def test_no_pack_rows_round_trip_every_document_in_the_seeded_order(tmp_path) -> None:
    texts = skewed_texts(400, 1)
    path = write_jsonl(tmp_path / "one.jsonl", texts)
    out = tmp_path / "out"
    keep_all = QualityFilter(max_repetition=1.0)  # the templated sentences repeat n-grams
    options = PrepareOptions(packing="none", max_shard_mb=0.02, quality=keep_all)
    manifest = prepare([path], out, 32, vocab_size=350, validation_fraction=0.0, seed=7, options=options)
    assert len(list((out / "train").glob("data-*.arrow"))) > 1  # several shards, read back as one
    tok = load_tokenizer(out / "tokenizer")
    eos = manifest["eos_token_id"]
    docs = [
        [*tok(texts[i], add_special_tokens=False)["input_ids"], eos]
        for i in split_order(np.arange(400), 7, "train")
    ]
    data = load_split(out / "train", seed=0)
    assert isinstance(data, VariableData) and data.seq_length == 32
    assert data.tokens.tolist() == [t for d in docs for t in d]
    assert data.n_tokens.max() == 32 and manifest["rows"]["train"] == data.rows
    assert manifest["packing"] == "none"
    assert manifest["documents_cut_into_pieces"]["train"] == sum(len(d) > 32 for d in docs) > 0
    assert manifest["tokens"]["train"] == len(data.tokens)


def test_a_micro_batch_is_right_padded_with_ignored_labels(unpacked) -> None:
    data = load_split(unpacked / "train", seed=0)
    rows = np.argsort(data.n_tokens)[[0, len(data.n_tokens) // 2, -1]]
    batch = data.batch(rows, length=40)
    lens = np.minimum(data.n_tokens[rows], 40)
    assert tuple(batch.input_ids.shape) == (3, lens.max()) and batch.n_tokens == lens.sum()
    for i, n in enumerate(lens):
        start = data.offsets[rows[i]]
        assert batch.input_ids[i, :n].tolist() == data.tokens[start : start + n].tolist()
        assert (batch.labels[i, :n] == batch.input_ids[i, :n]).all() and (batch.labels[i, n:] == -100).all()


def test_padding_does_not_change_the_loss(unpacked) -> None:
    """Right padding with label -100 and no attention mask gives the token-weighted loss of the sequences
    taken one at a time (why the loader passes no mask)."""
    import torch

    from toolkit.plan.load import load_model
    from toolkit.run.models import build_model

    torch.manual_seed(0)
    model = build_model(load_model(TEST_MODEL), {}).eval()
    data = load_split(unpacked / "train", seed=0)
    rows = np.array([3, 10, 11, 40, 41])
    with torch.no_grad():
        batch = data.batch(rows)
        padded = float(model(input_ids=batch.input_ids, labels=batch.labels).loss)
        alone = [data.batch(rows[i : i + 1]) for i in range(len(rows))]
        losses = [float(model(input_ids=b.input_ids, labels=b.labels).loss) for b in alone]
    weights = [b.n_tokens - 1 for b in alone]  # predictions per sequence
    assert len(set(data.n_tokens[rows])) > 1  # the micro-batch really is padded
    assert padded == pytest.approx(np.average(losses, weights=weights), rel=1e-5)


# --- the batching plan ---------------------------------------------------------------------------------------


def skewed_lengths(n: int, seed: int = 0) -> np.ndarray:
    return np.minimum(np.random.default_rng(seed).lognormal(3.2, 0.8, n).astype(np.int64) + 2, 512)


@pytest.mark.parametrize("micro_batches", [8, 32])
def test_token_budget_is_respected_and_every_step_fills_exactly_its_micro_batches(micro_batches) -> None:
    lengths = skewed_lengths(20_000)
    stream = Stream(len(lengths), lambda e: np.random.default_rng(e).permutation(len(lengths)))
    b = batching(seq_length=512, token_budget=2048, micro_batches=micro_batches, gradient_accumulation=4)
    position, real, padded = 0, 0, 0
    steps = 256 // micro_batches
    for step in range(steps):
        plan = plan_step(stream, lengths, position, step, b)
        assert len(plan.groups) == micro_batches
        for g in plan.groups:
            assert len(g) * lengths[g].max() <= 2048  # the padded tensor, not just the real tokens
        # the step reads the next contiguous rows of the stream, each exactly once
        assert sorted(np.concatenate(plan.groups).tolist()) == sorted(
            stream.take(position, plan.rows).tolist()
        )
        position, real, padded = position + plan.rows, real + plan.tokens, padded + plan.padded_tokens
    fill, padding = real / (steps * micro_batches * 2048), 1 - real / padded
    # fixed-size batching in the same memory: 2048 // 512 = 4 sequences, padded to the longest of them
    fixed = lengths[stream.take(0, 4 * 256)].reshape(256, 4)
    fixed_padding = 1 - fixed.sum() / (4 * fixed.max(axis=1)).sum()
    print(f"{micro_batches} micro-batches a step: {fill:.1%} of the budget real, padding {padding:.1%} "
          f"(fixed 4 x 512: padding {fixed_padding:.1%})")  # fmt: skip
    assert padding < (0.25 if micro_batches == 8 else 0.1) < fixed_padding
    assert fill > (0.75 if micro_batches == 8 else 0.9)


def test_padding_is_lower_than_fixed_size_batching_on_skewed_lengths(unpacked) -> None:
    data = load_split(unpacked / "train", seed=0)
    fixed = TrainLoader(data, global_batch=16, micro_batch=4, dp_rank=0, dp_size=1)  # 4 × 64 = 256 tokens
    real = padded = 0
    it = fixed.steps()
    for _ in range(30):
        for mb in next(it):
            real, padded = real + mb.n_tokens, padded + mb.input_ids.numel()
    it.close()
    fixed_fraction = 1 - real / padded
    b = batching(micro_batches=4, gradient_accumulation=4, token_budget=256, reference_tokens=16 * SEQ)
    loader = DynamicLoader(data, b, dp_rank=0, dp_size=1)
    it = loader.steps()
    plans = [next(it).plan for _ in range(30)]
    it.close()
    dynamic_fraction = 1 - sum(p.tokens for p in plans) / sum(p.padded_tokens for p in plans)
    print(f"padding: fixed 4 x 64 sequences {fixed_fraction:.1%}, token budget 256 {dynamic_fraction:.1%}")
    assert dynamic_fraction < fixed_fraction / 2
    # and each step carries more real tokens in the same number of micro-batches
    assert np.mean([p.tokens for p in plans]) > real / 30


def test_lr_follows_the_documented_rule() -> None:
    assert lr_factor(1024, 4096, "linear") == pytest.approx(0.25)
    assert lr_factor(1024, 4096, "sqrt") == pytest.approx(0.5)
    assert lr_factor(1024, 4096, "none") == 1.0
    assert batching(lr_scaling="sqrt", reference_tokens=512).lr_factor(2048) == pytest.approx(2.0)


def test_scaled_rates_follow_the_schedule_without_compounding() -> None:
    """DeepSpeed's WarmupLR on a torch optimizer: each step's rate is the schedule's × that step's factor."""
    import torch
    from deepspeed.runtime.lr_schedules import WarmupLR

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    sched = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=1e-3, warmup_num_steps=4, warmup_type="linear")
    initial = [g["lr"] for g in opt.param_groups]
    for step, factor in enumerate([0.5, 0.5, 2.0, 0.25, 0.5, 0.5]):
        expected = 1e-3 * min(max(step - 1, 0) / 4, 1.0)  # WarmupLR: iterations -1 and 0 both give min
        assert set_lrs(opt.param_groups, scheduled_lrs(sched, initial), factor) == [
            pytest.approx(expected * factor)
        ]
        assert opt.param_groups[0]["lr"] == pytest.approx(expected * factor)
        opt.step()
        sched.step()
    plain = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    for factor in (0.5, 0.5, 0.5):  # no scheduler: the configured rate × factor, never 0.1 × 0.5³
        set_lrs(plain.param_groups, scheduled_lrs(None, [0.1]), factor)
    assert plain.param_groups[0]["lr"] == pytest.approx(0.05)


@pytest.mark.parametrize(("steps", "full", "start"), [(6, 64, 8), (10, 100, 5), (1000, 2048, 64), (3, 4, 8)])
def test_curriculum_lengths_grow_monotonically_to_the_full_length(steps, full, start) -> None:
    c = Curriculum(steps=steps, full=full, start=start)
    lengths = [c.length(t) for t in range(steps + 5)]
    assert lengths[0] == min(full, -(-start // 8) * 8)  # short sequences first
    assert all(a <= b for a, b in itertools.pairwise(lengths))
    assert lengths[steps:] == [full] * 5 and max(lengths[:steps]) <= full
    assert all(n % 8 == 0 for n in lengths[:steps] if n < full)


def test_curriculum_truncates_and_the_budget_then_holds_more_sequences(unpacked) -> None:
    data = load_split(unpacked / "train", seed=0)
    b = batching(curriculum=Curriculum(steps=6, full=SEQ), token_budget=256)
    it = DynamicLoader(data, b, dp_rank=0, dp_size=1).steps()
    steps = [next(it) for _ in range(8)]
    it.close()
    assert [s.plan.length for s in steps] == [8, 16, 24, 32, 40, 48, 64, 64]
    for s in steps:
        assert all(mb.input_ids.shape[1] <= s.plan.length for mb in s.micro_batches)
        assert all(mb.input_ids.numel() <= 256 for mb in s.micro_batches)
    assert steps[0].plan.rows > 2 * steps[-1].plan.rows  # 8-token sequences: many more per micro-batch


# --- determinism, resumption, lockstep ----------------------------------------------------------------------


def run_loader(data, b, dp_rank=0, dp_size=1, position=0, step=0, steps=5):
    loader = DynamicLoader(data, b, dp_rank, dp_size, position=position, step=step)
    it = loader.steps()
    got = [[mb.input_ids.numpy().copy() for mb in next(it).micro_batches] for _ in range(steps)]
    it.close()
    return got, loader.position, loader.step


def same(a, b) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


def test_same_seed_gives_the_same_batches_and_another_seed_others(unpacked) -> None:
    b = batching(curriculum=Curriculum(steps=4, full=SEQ))
    first = run_loader(load_split(unpacked / "train", seed=5), b)[0]
    again = run_loader(load_split(unpacked / "train", seed=5), b)[0]
    other = run_loader(load_split(unpacked / "train", seed=6), b)[0]
    assert same(first, again) and not same(first, other)


def test_resume_mid_epoch_continues_with_the_next_unseen_batch(unpacked) -> None:
    data = load_split(unpacked / "train", seed=1)
    b = batching(curriculum=Curriculum(steps=5, full=SEQ), token_budget=1024)
    straight, end_position, end_step = run_loader(data, b, steps=30)
    assert end_position > data.rows  # the run crosses an epoch boundary
    head, position, step = run_loader(data, b, steps=11)
    assert 0 < position < data.rows and step == 11  # stopped mid-epoch
    tail, position2, step2 = run_loader(data, b, position=position, step=step, steps=19)
    assert same(head + tail, straight) and (position2, step2) == (end_position, end_step)
    # the first resumed step reads rows no earlier step of the epoch has read
    loader = DynamicLoader(data, b, 0, 1)
    seen = set(loader._stream.take(0, position).tolist())
    assert not seen & set(np.concatenate(loader.plan(position, step).groups).tolist())


def test_every_rank_runs_the_same_micro_steps_on_disjoint_rows(unpacked) -> None:
    data = load_split(unpacked / "train", seed=2)
    b = batching(micro_batches=6, gradient_accumulation=3, token_budget=320)
    loaders = [DynamicLoader(data, b, r, 2) for r in range(2)]
    its = [ld.steps() for ld in loaders]
    for _ in range(6):
        a, c = (next(it) for it in its)
        assert len(a.micro_batches) == len(c.micro_batches) == 3  # the same micro-steps on every rank
        assert all(np.array_equal(x, y) for x, y in zip(a.plan.groups, c.plan.groups, strict=True))
        rows_a = np.concatenate(a.plan.share(0, 3))
        rows_c = np.concatenate(c.plan.share(1, 3))
        assert not set(rows_a.tolist()) & set(rows_c.tolist())
        assert len(rows_a) + len(rows_c) == a.plan.rows
        assert sum(mb.n_tokens for mb in a.micro_batches + c.micro_batches) == a.plan.tokens
    for it in its:
        it.close()
    assert loaders[0].position == loaders[1].position > 0


# --- options: flags over DeepSpeed's dynamic_batching block ---------------------------------------------------


def test_the_config_block_deepspeed_never_applies_is_read_and_flags_override_it() -> None:
    block = {"enabled": True, "max_tokens": 4096, "lr_scaling_method": "linear", "max_batch_size": 64}
    config = {"data_efficiency": {"data_sampling": {"dynamic_batching": block}}}
    opts = dynamic_options(config, {})
    assert (opts.token_budget, opts.lr_scaling, opts.max_sequences) == (4096, "linear", 64)
    assert dynamic_options(config, {"token_budget": 1024}).token_budget == 1024
    assert dynamic_options({}, {}) is None and dynamic_options({**config, "data_efficiency": {}}, {}) is None
    off = {"data_efficiency": {"data_sampling": {"dynamic_batching": {**block, "enabled": False}}}}
    assert dynamic_options(off, {}) is None
    assert dynamic_options({}, {"curriculum_steps": 10}).lr_scaling == "sqrt"


def test_bad_dynamic_batching_settings_name_the_flag() -> None:
    with pytest.raises(
        UserError, match=r"--token-budget \(dynamic_batching.max_tokens\): input should be greater"
    ):
        dynamic_options({}, {"token_budget": 0})
    with pytest.raises(UserError, match=r"dynamic_batching\.max_tokens: required when enabled"):
        dynamic_options({"data_efficiency": {"data_sampling": {"dynamic_batching": {"enabled": True}}}}, {})
    layout = dict(seq_length=64, dp=2, gradient_accumulation=2, micro_batch=4, pipeline_stages=1, seed=0)
    with pytest.raises(UserError, match=r"--token-budget: 32 tokens do not hold one sequence .* at least 64"):
        resolve(DynamicOptions(token_budget=32), **layout)
    with pytest.raises(UserError, match="--curriculum-start: 128 exceeds the data's seq_length"):
        resolve(DynamicOptions(curriculum_steps=5, curriculum_start=128), **layout)
    with pytest.raises(UserError, match="--token-budget: not with pipeline parallelism"):
        resolve(DynamicOptions(token_budget=256), **{**layout, "pipeline_stages": 2})
    b = resolve(DynamicOptions(token_budget=256, curriculum_steps=5), **layout)
    assert (b.micro_batches, b.reference_tokens, b.length(0), b.length(5)) == (4, 16 * 64, 8, 64)


# --- the real engine: 2 ranks through dstk launch --------------------------------------------------------------


def finished(job) -> bool:
    """Exit 0, or gloo's occasional abort at teardown after a run that wrote its summary (toolkit.run.runtime.shutdown)."""
    aborted = "terminate called without an active exception" in job.output
    return job.code == 0 or (aborted and (job.run_dir / "summary.json").is_file())


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "train"]


@pytest.mark.multiprocess
def test_two_ranks_train_with_a_token_budget_and_a_curriculum_and_resume_exactly(tmp_path, unpacked) -> None:
    """dstk launch → dstk train --token-budget --curriculum-steps on 2 CPU ranks (ZeRO-1, fp32): the loss
    falls, every step's learning rate is the schedule's × the documented factor, and a run resumed from the
    step-6 checkpoint continues with the same losses as the uninterrupted one."""
    steps = 12
    cfg = config(
        tmp_path / "ds.json", "--model", TEST_MODEL, "--zero-stage", "1", "--precision", "fp32",
        "--micro-batch", "4", "--global-batch", "8", "--lr", "3e-3", "--train-steps", str(steps),
        "--warmup-steps", "2",
    )  # fmt: skip
    common = ["--model", TEST_MODEL, "--data", str(unpacked), "--steps", str(steps), "--log-every", "1"]
    common += ["--token-budget", "256", "--curriculum-steps", "4", "--lr-scaling", "linear"]
    common += ["--eval-every", "6", "--eval-rows", "16"]  # the validation split is unpacked too
    straight = launch(
        tmp_path / "a", cfg, [*common, "--checkpoint-dir", str(tmp_path / "ck"), "--save-every", "6"]
    )
    assert finished(straight), straight.output[-3000:]
    metrics = read_metrics(tmp_path / "a")
    losses = [m["loss"] for m in metrics]
    assert len(losses) == steps and np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3
    assert [m["seq_length"] for m in metrics] == [8, 16, 32, 48] + [SEQ] * 8  # 8 + 56·t/4, floored to 8s
    for m in metrics:  # 2 ranks × 1 micro-batch of <= 256 tokens, against 8 × 64 = 512 tokens
        assert m["tokens"] <= 2 * 256 and m["lr_factor"] == pytest.approx(m["tokens"] / 512)
        assert 0 <= m["padding_fraction"] < 0.5
    assert metrics[0]["sequences"] > 3 * metrics[-1]["sequences"]  # 8-token sequences: many per micro-batch
    # the rate each step used: DeepSpeed's schedule from the config, × the factor
    import torch
    from deepspeed.runtime import lr_schedules

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-3)
    spec = json.loads(cfg.read_text())["scheduler"]
    schedule = getattr(lr_schedules, spec["type"])(opt, **spec["params"])
    scheduled = []
    for _ in range(steps):
        scheduled.append(opt.param_groups[0]["lr"])
        schedule.step()
    applied = [s * m["lr_factor"] for s, m in zip(scheduled, metrics, strict=True)]
    assert [m["lr"] for m in metrics] == pytest.approx(applied)

    resume_dir = tmp_path / "ck2"
    resume_dir.mkdir()
    shutil.copytree(tmp_path / "ck" / tag_for(6), resume_dir / tag_for(6))
    resumed = launch(tmp_path / "b", cfg, [*common, "--checkpoint-dir", str(resume_dir), "--resume", "auto"])
    assert finished(resumed), resumed.output[-3000:]
    assert "resumed from" in resumed.output
    again = read_metrics(tmp_path / "b")
    assert [m["step"] for m in again] == list(range(7, steps + 1))
    assert [m["loss"] for m in again] == pytest.approx(losses[6:], rel=1e-6, abs=1e-6)
    assert [m["sequences"] for m in again] == [m["sequences"] for m in metrics[6:]]
    evals = straight.summary["evals"]
    assert [e["step"] for e in evals] == [6, 12] and evals[1]["loss"] < evals[0]["loss"]
    assert resumed.summary["evals"][-1]["loss"] == pytest.approx(evals[1]["loss"], rel=1e-6)


def test_train_flags_that_cannot_apply_exit_2_with_one_line(tmp_path, unpacked) -> None:
    from tests.cli import dstk, dstk_process

    cfg = config(
        tmp_path / "ds.json",
        "--model",
        TEST_MODEL,
        "--gpus-per-node",
        "1",
        "--micro-batch",
        "4",
        "--global-batch",
        "4",
    )
    base = ["train", "--model", TEST_MODEL, "--config", str(cfg), "--data", str(unpacked), "--steps", "2"]
    cases = {
        ("--lr-scaling", "linear"): "--lr-scaling: only applies with --token-budget or --curriculum-steps",
        ("--curriculum-start", "16"): "--curriculum-start: only applies with --curriculum-steps K",
        (
            "--token-budget",
            "0",
        ): "--token-budget (dynamic_batching.max_tokens): input should be greater than 0",
    }
    for flags, message in cases.items():
        result = dstk(*base, *flags)
        assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1
    # checked against the data once the run has read it: a budget below one full sequence
    result = dstk_process(*base, "--token-budget", "32", "--run-dir", str(tmp_path / "run"), "--no-progress")
    assert result.code == 2, result.err[-2000:]
    assert "--token-budget: 32 tokens do not hold one sequence of the data's seq_length (64)" in result.err
