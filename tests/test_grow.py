"""dstk grow: function-preserving depth and width growth, its validation, the re-plan, the schedule, and a grown
model that trains on under `dstk train --init-from` on 2 ranks.

The growth maths is checked in one process on HF models built from configs and trained a few steps (so the
weights are not at their initialisation); only the last test launches ranks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli import REPO, dstk, dstk_process
from tests.distributed import TEST_MODEL
from toolkit.plan.params import count_params

LLAMA_MODEL = str(REPO / "tests" / "models" / "tiny-test-llama.yaml")
TOLERANCE = 1e-5


def _variant(tmp: Path, base: str, name: str, **changes: object) -> str:
    """A copy of the model description `base` with `changes`, written under `tmp`."""
    data = {**yaml.safe_load(Path(base).read_text()), **changes, "name": name}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _batch(vocab: int, seed: int, rows: int = 8, seq: int = 48):
    """Token sequences with structure a tiny model learns in a few steps (every odd token follows its
    predecessor), so that the parent is a trained model rather than its initialisation."""
    import torch

    ids = torch.randint(0, 64, (rows, seq), generator=torch.Generator().manual_seed(seed))
    ids[:, 1::2] = (ids[:, ::2] * 3 + 1) % 64
    return ids % vocab


def _loss(model, ids) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss.double())


def _load(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@pytest.fixture(scope="module")
def parents(tmp_path_factory) -> dict[str, Path]:
    """The 2-layer GPT-2 and Llama test models after 30 AdamW steps, saved with save_pretrained."""
    import torch

    from toolkit.plan.load import load_model
    from toolkit.run.models import build_model

    out = {}
    for arch, ref in (("gpt2", TEST_MODEL), ("llama", LLAMA_MODEL)):
        torch.manual_seed(0)
        model = build_model(load_model(ref), {})
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step in range(30):
            ids = _batch(512, seed=step)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        out[arch] = tmp_path_factory.mktemp(f"parent-{arch}")
        model.save_pretrained(out[arch])
    return out


BASES = {"gpt2": TEST_MODEL, "llama": LLAMA_MODEL}


def test_depth_maps_stack_and_interleave() -> None:
    from toolkit.plan.growth_map import depth_map

    assert depth_map(2, 4, "stack") == [(0, False), (1, False), (0, True), (1, True)]
    assert depth_map(2, 4, "interleave") == [(0, False), (0, True), (1, False), (1, True)]
    assert depth_map(2, 5, "stack") == [(0, False), (1, False), (0, True), (1, True), (0, True)]
    assert depth_map(2, 3, "interleave") == [(0, False), (0, True), (1, False)]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["stack", "interleave"])
def test_zero_out_depth_growth_keeps_the_parents_loss(tmp_path, parents, arch, method) -> None:
    """2 → 4 layers with the new blocks' output projections zeroed: the grown model's loss on a fresh batch
    equals the parent's to 1e-5 (eval mode); copy-stacking changes it."""
    from toolkit.plan.load import load_model
    from toolkit.run.grow import grow

    target = load_model(_variant(tmp_path, BASES[arch], f"{arch}-4", n_layers=4))
    ids = _batch(512, seed=1000)
    parent_loss = _loss(_load(parents[arch]), ids)
    result = grow(parents[arch], target, tmp_path / "zero", depth_method=method)
    grown = _load(tmp_path / "zero")
    assert grown.config.num_hidden_layers == 4
    grown_loss = _loss(grown, ids)
    assert abs(grown_loss - parent_loss) < TOLERANCE, (parent_loss, grown_loss)
    assert result.check["abs_diff"] < TOLERANCE and result.growth.function_preserving
    # the new blocks are copies whose residual-branch outputs are exactly zero; the others are the parent's
    state, parent_state = grown.state_dict(), _load(parents[arch]).state_dict()
    prefix = "transformer.h." if arch == "gpt2" else "model.layers."
    out_proj = "attn.c_proj.weight" if arch == "gpt2" else "self_attn.o_proj.weight"
    news = [j for j, (_, new) in enumerate(result.growth.blocks) if new]
    assert len(news) == 2
    for j, (src, new) in enumerate(result.growth.blocks):
        zeroed = state[f"{prefix}{j}.{out_proj}"].abs().max() == 0
        assert zeroed == new
        if not new:
            assert state[f"{prefix}{j}.{out_proj}"].equal(parent_state[f"{prefix}{src}.{out_proj}"])

    copied = grow(parents[arch], target, tmp_path / "copy", depth_method=method, new_blocks="copy")
    copy_loss = _loss(_load(tmp_path / "copy"), ids)
    assert abs(copy_loss - parent_loss) > 1e-3 and not copied.growth.function_preserving
    print(f"{arch} {method}: parent {parent_loss:.6f}, zero-out {grown_loss:.6f}, copy {copy_loss:.6f}")


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_width_and_depth_growth_keeps_the_parents_loss(tmp_path, parents, arch) -> None:
    """Width ×2 (hidden, heads, key/value heads, MLP) and 2 → 4 layers at once: same loss to 1e-5."""
    from toolkit.plan.load import load_model
    from toolkit.run.grow import grow

    base = yaml.safe_load(Path(BASES[arch]).read_text())
    wide = dict(n_layers=4, hidden_size=128, n_heads=8)
    if arch == "llama":
        wide.update(n_kv_heads=4, ffn_hidden_size=2 * base["ffn_hidden_size"], head_dim=16)
    target = load_model(_variant(tmp_path, BASES[arch], f"{arch}-wide", **wide))
    ids = _batch(512, seed=2000)
    parent_loss = _loss(_load(parents[arch]), ids)
    result = grow(parents[arch], target, tmp_path / "wide")
    grown = _load(tmp_path / "wide")
    assert sum(p.numel() for p in grown.parameters()) == count_params(target).total == result.n_params[1]
    assert result.growth.factors == {"res": 2, "heads": 2, "ffn": 2}
    grown_loss = _loss(grown, ids)
    assert abs(grown_loss - parent_loss) < TOLERANCE, (parent_loss, grown_loss)
    print(f"{arch} width ×2 + depth ×2: parent {parent_loss:.6f}, grown {grown_loss:.6f}")


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_random_split_breaks_the_symmetry_of_replicated_units(tmp_path, parents, noise) -> None:
    """With an even split a replicated unit and its copy get equal gradients and stay equal for ever (the grown
    model is the small one in disguise); the random split keeps the function and lets them diverge."""
    from toolkit.plan.load import load_model
    from toolkit.run.grow import grow

    target = load_model(_variant(tmp_path, TEST_MODEL, "wide", hidden_size=128, n_heads=8))
    grow(parents["gpt2"], target, tmp_path / "g", width_noise=noise)
    model = _load(tmp_path / "g")
    model.train()
    ids = _batch(512, seed=5)
    model(input_ids=ids, labels=ids).loss.backward()
    grad = model.transformer.h[0].mlp.c_fc.weight.grad  # (in, out): MLP unit j and its copy j + 256
    gap = float((grad[:, :256] - grad[:, 256:]).abs().max() / grad.abs().max())
    assert (gap == 0) if noise == 0 else (gap > 0.01), gap


def test_grow_rejects_targets_that_are_not_growths(tmp_path, parents) -> None:
    """Bad targets exit 2 with one line naming the field, all problems at once, before anything is written."""
    p = str(parents["gpt2"])
    cases = {
        _variant(tmp_path, TEST_MODEL, "v", n_layers=4, vocab_size=1024): "vocab_size: 1024 differs",
        _variant(
            tmp_path, TEST_MODEL, "h", hidden_size=96, n_heads=6
        ): "hidden_size: 96 is not a whole multiple",
        _variant(tmp_path, TEST_MODEL, "l", n_layers=1): "n_layers: 1 is fewer than the parent's 2",
        TEST_MODEL: "nothing to grow",
        _variant(
            tmp_path, LLAMA_MODEL, "a", n_layers=4
        ): "architecture: llama differs from the parent's gpt2",
        _variant(
            tmp_path, TEST_MODEL, "p", n_layers=4, max_position_embeddings=128
        ): "max_position_embeddings",
    }
    for target, message in cases.items():
        r = dstk("grow", "--from", p, "--to", target, "-o", str(tmp_path / "out"))
        assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err
    two = _variant(tmp_path, TEST_MODEL, "two", vocab_size=1024, hidden_size=96, n_heads=6)
    both = dstk("grow", "--from", p, "--to", two, "-o", str(tmp_path / "out"))
    assert both.code == 2 and "vocab_size: 1024" in both.err and "hidden_size: 96" in both.err
    assert not (tmp_path / "out").exists()


def test_grow_rejects_bad_flags_and_sources(tmp_path, parents) -> None:
    target = _variant(tmp_path, TEST_MODEL, "t4", n_layers=4)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "empty").mkdir()
    p = str(parents["gpt2"])
    cases = [
        (["--from", str(tmp_path / "nope"), "--to", target, "-o", str(tmp_path / "o")], "is not a directory"),
        (
            ["--from", str(tmp_path / "empty"), "--to", target, "-o", str(tmp_path / "o")],
            "neither a save_pretrained",
        ),
        (["--from", p, "--to", target, "-o", str(tmp_path / "full")], "--out:"),
        (["--from", p, "-o", str(tmp_path / "o")], "--to: required"),
        (["--from", p, "--to", target, "-o", str(tmp_path / "o"), "--width-noise", "1.5"], "--width-noise"),
        (
            ["--from", p, "--to", target, "-o", str(tmp_path / "o"), "--from-model", TEST_MODEL],
            "--from-model",
        ),
        (["--from", p, "--to", target, "-o", str(tmp_path / "o"), "--cluster", "nosuch"], "--cluster"),
        (["--schedule", str(tmp_path / "s.yaml"), "--from", p], "--schedule"),
        (["--from", p, "--to", target, "-o", str(tmp_path / "o"), "--dry-run"], "--dry-run"),
    ]
    for argv, message in cases:
        r = dstk("grow", *argv)
        assert r.code == 2 and message in r.err and "Traceback" not in r.err, (argv, r.err)


def test_growth_validation_is_pure_and_names_each_problem() -> None:
    from toolkit.errors import UserError
    from toolkit.plan.growth_map import plan_growth
    from toolkit.plan.load import load_model
    from toolkit.plan.specs import ModelSpec

    llama = load_model(LLAMA_MODEL)
    bad_kv = llama.model_copy(update={"n_heads": 8, "n_kv_heads": 2, "hidden_size": 128})
    with pytest.raises(UserError, match="n_kv_heads: must grow by the factor n_heads grows by"):
        plan_growth(llama, bad_kv)
    tiny = load_model("tests/models/tiny-test-gpt2.yaml").model_dump(exclude={"position_embedding"})
    bloom = ModelSpec(**{**tiny, "architecture": "bloom"})
    wider = {
        "hidden_size": 2 * bloom.hidden_size,
        "n_heads": 2 * bloom.n_heads,
        "n_kv_heads": 2 * bloom.n_heads,
    }
    with pytest.raises(UserError, match="BLOOM grow in depth only"):
        plan_growth(bloom, bloom.model_copy(update={**wider, "ffn_hidden_size": 2 * bloom.ffn_hidden_size}))
    moe = load_model("tests/models/tiny-test-moe.yaml")
    with pytest.raises(UserError, match="num_experts: growing MoE"):
        plan_growth(moe, moe.model_copy(update={"n_layers": moe.n_layers * 2}))


def test_grow_the_replan_and_the_schedule_import_no_torch() -> None:
    """The validation, the re-plan and the orchestrator are pure (like dstk plan): milliseconds, no torch."""
    code = (
        "import sys\n"
        "import toolkit.commands.grow, toolkit.plan.growth_map, toolkit.plan.progressive\n"
        "from toolkit.plan.load import load_model, load_cluster\n"
        "from toolkit.plan.growth_map import plan_growth\n"
        "p = load_model('llama-7b'); g = p.model_copy(update={'n_layers': 64, 'name': 'grown'})\n"
        "plan_growth(p, g)\n"
        "print('\\n'.join(toolkit.plan.progressive.replan(p, g, load_cluster('dgx-a100-40g'))))\n"
        "assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    # a 13B model on 8 × 40 GB GPUs needs full recomputation where the 7B one did not (HF's SDPA stores no
    # attention scores, so the 7B one needs none at all)
    assert "recompute none → full" in proc.stdout, proc.stdout
    assert "--global-batch 512" in proc.stdout


def test_cli_prints_the_check_and_the_replan(tmp_path, parents) -> None:
    target = _variant(tmp_path, TEST_MODEL, "t4", n_layers=4)
    r = dstk(
        "grow", "--from", str(parents["gpt2"]), "--to", target, "-o", str(tmp_path / "o"),
        "--gpus-per-node", "2", "--global-batch", "8", "--precision", "fp32",
    )  # fmt: skip
    assert r.code == 0, r.err
    assert "2←0 (new, zero-out)" in r.out and "function preserved" in r.out
    assert "Re-plan on cpu (1 × 2)" in r.out and "--cluster cpu --gpus-per-node 2" in r.out
    assert "--precision fp32 --global-batch 8" in r.out
    record = json.loads((tmp_path / "o" / "dstk_grow.json").read_text())
    assert record["check"]["abs_diff"] < TOLERANCE and record["target"]["n_layers"] == 4
    assert [b["from"] for b in record["blocks"]] == [0, 1, 0, 1]


def _schedule(tmp: Path, data: str, big: str) -> Path:
    path = tmp / "schedule.yaml"
    schedule = {
        "run_dir": str(tmp / "run"),
        "data": data,
        "gpus_per_node": 2,
        "config": ["--precision", "fp32", "--zero-stage", "2", "--micro-batch", "4", "--global-batch", "8",
                   "--lr", "3e-3", "--warmup-steps", "2"],
        "train": ["--log-every", "1"],
        "stages": [
            {"model": TEST_MODEL, "steps": 10},
            {"model": big, "steps": 8, "config": ["--lr", "1e-3"], "grow": ["--eval-rows", "32"]},
        ],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(schedule))
    return path


def test_schedule_dry_run_lists_config_grow_and_launch(tmp_path) -> None:
    big = _variant(tmp_path, TEST_MODEL, "big", n_layers=4)
    r = dstk("grow", "--schedule", str(_schedule(tmp_path, str(tmp_path / "data"), big)), "--dry-run")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert [line.split()[3] for line in lines] == ["config", "launch", "config", "grow", "launch"]
    assert "--plan" in lines[0] and "--train-steps 10" in lines[0]
    assert (
        f"--from {tmp_path / 'run' / 'stage0' / 'checkpoints'}" in lines[3] and "--zero-stage 2" in lines[3]
    )
    assert "--lr 1e-3" in lines[2] and "--lr" not in lines[3]  # only layout constraints reach the re-plan
    assert f"--init-from {tmp_path / 'run' / 'stage1' / 'init'}" in lines[4] and "--seed 1" in lines[4]
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [{model: x, steps: 1, stepz: 2}]\n")
    r = dstk("grow", "--schedule", str(bad))
    assert r.code == 2 and "stepz: unknown field" in r.err


@pytest.mark.multiprocess
def test_grown_checkpoint_trains_on_two_ranks(tmp_path, prepared_data) -> None:
    """`dstk grow --schedule`: 10 steps of the 2-layer model on 2 ranks (ZeRO-2 checkpoint) → grown to 4 layers
    from the DeepSpeed checkpoint (zero-out) with the same validation loss to 1e-5 → 8 more steps on 2 ranks
    through `dstk train --init-from`, the loss going down from where the parent left it."""
    big = _variant(tmp_path, TEST_MODEL, "big", n_layers=4)
    r = dstk_process("grow", "--schedule", str(_schedule(tmp_path, str(prepared_data), big)), timeout=300)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    result = json.loads((tmp_path / "run" / "progressive.json").read_text())
    small, grown = result["stages"]
    check = grown["grow"]["check"]
    assert check["abs_diff"] < TOLERANCE and "validation rows" in check["on"], check
    assert grown["grow"]["source"].endswith("step00000010")
    assert small["losses"][-1] < small["losses"][0] - 0.5
    losses = grown["losses"]
    assert len(losses) == 8 and grown["n_params"] > small["n_params"]
    assert abs(losses[0] - small["losses"][-1]) < 0.3  # it starts where the parent was …
    assert min(losses[-3:]) < losses[0] - 0.1  # … and trains on
    assert result["total_flops"] == small["flops"] + grown["flops"]
    # copy-stacking from the same checkpoint, the parent's description inferred from the weights' shapes
    copy = dstk_process(
        "grow", "--from", str(tmp_path / "run" / "stage0" / "checkpoints"), "--to", big, "-o", str(tmp_path / "copy"),
        "--new-blocks", "copy", "--data", str(prepared_data), "--eval-rows", "32",
    )  # fmt: skip
    assert copy.code == 0, copy.err[-2000:]
    copied = json.loads((tmp_path / "copy" / "dstk_grow.json").read_text())["check"]
    assert copied["parent_loss"] == pytest.approx(check["parent_loss"], abs=1e-6)
    assert copied["abs_diff"] > 1e-3
    print(
        f"parent {check['parent_loss']:.6f} → zero-out {check['grown_loss']:.6f} (|Δ| {check['abs_diff']:.1e}), "
        f"copy-stack {copied['grown_loss']:.6f}; grown run {[round(x, 4) for x in losses]}"
    )


@pytest.mark.parametrize("base", [TEST_MODEL, LLAMA_MODEL])
def test_parent_description_is_inferred_from_checkpoint_shapes(tmp_path, base) -> None:
    """A DeepSpeed checkpoint holds no model description: depth, width, heads and MLP width come from the
    weights' shapes, the rest (which growth keeps) from --to."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit.plan.load import load_model
    from toolkit.run.grow import infer_parent
    from toolkit.run.models import hf_config

    parent = load_model(base)
    changes = dict(n_layers=4, hidden_size=128, n_heads=8)
    if parent.architecture == "llama":
        changes.update(n_kv_heads=4, ffn_hidden_size=352, head_dim=16)
    target = load_model(_variant(tmp_path, base, "t", **changes))
    with torch.device("meta"):
        state = AutoModelForCausalLM.from_config(hf_config(parent)).state_dict()
    inferred = infer_parent(target, state)
    for name in (
        "n_layers",
        "hidden_size",
        "n_heads",
        "n_kv_heads",
        "head_dim",
        "ffn_hidden_size",
        "vocab_size",
    ):
        assert getattr(inferred, name) == getattr(parent, name), name
    assert count_params(inferred).total == count_params(parent).total


@pytest.mark.parametrize(
    ("arch", "wide"),
    [
        ("bloom", None),
        ("qwen2", dict(hidden_size=128, n_heads=8, n_kv_heads=4, ffn_hidden_size=352, head_dim=16)),
        ("mistral", dict(hidden_size=128, n_heads=8, n_kv_heads=4, ffn_hidden_size=352, head_dim=16)),
    ],
)
def test_other_families_grow_exactly(tmp_path, arch, wide) -> None:
    """BLOOM (depth only), Qwen2 (q/k/v biases) and Mistral grow with the parent's loss to 1e-5; weights are
    perturbed away from their initialisation first (biases start at zero, which would hide a mapping error)."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit.plan.load import load_model
    from toolkit.run.grow import grow
    from toolkit.run.models import hf_config

    base = dict(
        name=arch, architecture=arch, n_layers=2, hidden_size=64, n_heads=4, vocab_size=512, seq_length=64
    )
    if arch != "bloom":
        base.update(n_kv_heads=2, ffn_hidden_size=176)
    parent_path = tmp_path / "parent.yaml"
    parent_path.write_text(yaml.safe_dump(base))
    torch.manual_seed(0)
    parent = AutoModelForCausalLM.from_config(hf_config(load_model(str(parent_path))))
    with torch.no_grad():
        for p in parent.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    parent.save_pretrained(tmp_path / "parent")
    ids = _batch(512, seed=3)
    for name, changes in (("deep", dict(n_layers=4)), ("wide", {**(wide or {}), "n_layers": 4})):
        if name == "wide" and wide is None:
            continue
        target = load_model(_variant(tmp_path, str(parent_path), f"{arch}-{name}", **changes))
        result = grow(tmp_path / "parent", target, tmp_path / name)
        grown = AutoModelForCausalLM.from_pretrained(tmp_path / name, attn_implementation="eager")
        assert abs(_loss(grown, ids) - _loss(parent, ids)) < TOLERANCE, (arch, name)
        assert result.check["abs_diff"] < TOLERANCE
