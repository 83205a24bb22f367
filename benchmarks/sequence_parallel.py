"""Activation memory per rank with DeepSpeed-Ulysses (`--sp 2`) against `--sp 1`, beside `dstk estimate`.

What is measured: the bytes autograd saves for backward in one training forward of one sequence — the model
and the loss, as `dstk train` computes them (`Trainer._micro_step` at sp = 1; `SequenceParallel.loss` on
this rank's slice at sp = 2) — counted with `torch.autograd.graph.saved_tensors_hooks`, once per storage,
parameters left out. Saved tensors are what stays alive from forward to backward, i.e. what activation memory
is; transient buffers (the all-to-all's, the logits' gradient in backward) are not in it. The figure is split
into the decoder blocks (saved while a block's forward runs) and the rest (embedding output, final norm, LM
head, loss).

Beside it, `dstk estimate --json`'s `memory_per_gpu_bytes.activations` for the same model and layout, and its
two parts (toolkit/plan/cost/activations.py): n_layers × `block_bytes` and `logits_bytes`, both divided by sp
(estimate.py `_stage_activations`).

One launch of 2 ranks (`dstk launch` with the `--sp 2` config `dstk config` writes, ZeRO-2, fp32): each rank
first measures the plain model on the whole sequence (sp = 1), then registers Ulysses, builds the engine with
the config and its mpu, and measures its slice. A tiny Llama (h 64, 4 heads, 2 kv heads, 2 blocks, vocab 512)
at a long sequence, so the sequence terms dominate. Writes JSON and Markdown to benchmarks/results/.

Usage: python benchmarks/sequence_parallel.py [--seq-length 2048] [--out-dir DIR]
    (worker, run by the script under `dstk launch`: sequence_parallel.py --worker CONFIG MODEL OUT.json)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = {
    "name": "tiny-llama-long",
    "architecture": "llama",
    "n_layers": 2,
    "hidden_size": 64,
    "n_heads": 4,
    "n_kv_heads": 2,
    "ffn_hidden_size": 176,
    "vocab_size": 512,
}
LAYOUT = ["--zero-stage", "2", "--precision", "fp32", "--micro-batch", "1", "--global-batch", "2"]


def saved_bytes(run: Any, model: Any, blocks: list[Any]) -> dict[str, int]:
    """Bytes of the distinct non-parameter storages autograd saves while `run()` runs: in the decoder
    `blocks`, elsewhere, and in all."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    where = {"inside": 0}
    out = {"blocks": 0, "other": 0}

    def enter(*_: Any) -> None:
        where["inside"] += 1

    def leave(*_: Any) -> None:
        where["inside"] -= 1

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in seen and key not in params:
            seen.add(key)
            out["blocks" if where["inside"] else "other"] += storage.nbytes()
        return t

    hooks = [b.register_forward_pre_hook(enter) for b in blocks] + [
        b.register_forward_hook(leave) for b in blocks
    ]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = run()
    finally:
        for h in hooks:
            h.remove()
    del loss
    return {**out, "total": out["blocks"] + out["other"]}


def worker(config_path: str, model_path: str, out_path: str) -> None:
    import deepspeed
    import torch

    import toolkit
    from toolkit.data.loader import Batch
    from toolkit.integrations.ds_layout import layout_from_config
    from toolkit.parallel import ulysses
    from toolkit.plan.load import load_model
    from toolkit.run.loop_state import gather
    from toolkit.run.models import build_model
    from toolkit.run.runtime import init_distributed

    rt = init_distributed()
    config = json.loads(Path(config_path).read_text())
    spec = load_model(model_path)
    layout = layout_from_config(config, rt.world_size)
    torch.manual_seed(0)
    model = build_model(spec, config)
    blocks = list(model.get_submodule(spec.family.block_prefix.rstrip(".")))
    ids = torch.randint(0, spec.vocab_size, (1, spec.seq_length), generator=torch.Generator().manual_seed(1))
    batch = Batch(ids, ids.clone(), spec.seq_length)
    t0 = time.perf_counter()
    sp1 = saved_bytes(lambda: model(input_ids=ids, labels=batch.labels).loss, model, blocks)  # Trainer's call
    mpu = ulysses.register(model, layout)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config, mpu=mpu
    )
    sp = ulysses.SequenceParallel(engine, layout)
    sliced = sp.slice_batch(batch)  # the adapter's cut, without its all-gather
    sp2 = saved_bytes(lambda: sp.loss(sliced)[0], model, blocks)
    record = {"sp1": sp1, "sp2": sp2, "measure_s": time.perf_counter() - t0, "toolkit": toolkit.__file__}
    rows = gather(record)
    if rt.is_main:
        Path(out_path).write_text(json.dumps(rows))


def estimate_parts(model_file: Path, sp: int, recompute: str) -> dict[str, float]:
    """`dstk estimate`'s activations for `--sp sp --recompute recompute`, and its two terms (the cost model's
    functions; their sum is checked against the estimate)."""
    from benchmarks.common import dstk
    from toolkit.plan.cost.activations import attention_recompute, block_bytes, logits_bytes
    from toolkit.plan.load import load_model

    flags = ["--model", str(model_file), "--cluster", "cpu", "--sp", str(sp), "--recompute", recompute]
    est = json.loads(dstk("estimate", *flags, *LAYOUT, "--json").stdout)
    spec = load_model(str(model_file))
    # HF's SDPA: the estimate prices `none` as `selective` for the attention core (activations.py)
    effective = attention_recompute(recompute, flash=spec.family.sdpa)
    # dstk train runs HF's eager modules, whose extra saved tensors the estimate counts (hf_modules)
    blocks = spec.n_layers * block_bytes(spec, 1, 4, 1, False, effective, hf_modules=True) / sp
    logits = logits_bytes(spec, 1, 4, 1) / sp
    total = est["memory_per_gpu_bytes"]["activations"]
    if abs(blocks + logits - total) > 1e-6 * total:
        raise SystemExit(f"the estimate's activations {total} are not blocks {blocks} + logits {logits}")
    return {"blocks": blocks, "logits": logits, "total": total}


def measure(seq_length: int, tmp: Path) -> dict[str, Any]:
    """One 2-rank launch measuring sp = 1 and sp = 2, with the estimates beside them."""
    import yaml

    from benchmarks.common import bench_env, dstk, free_port

    env = bench_env()
    model_file = tmp / "model.yaml"
    model_file.write_text(yaml.safe_dump({**MODEL, "seq_length": seq_length}))
    cfg, out = tmp / "sp2.json", tmp / "out.json"
    common = ["--model", str(model_file), "--cluster", "cpu", *LAYOUT]
    place = ["--nodes", "1", "--gpus-per-node", "2", "--log-dir", str(tmp / "logs")]  # monitors: in tmp
    dstk("config", *common, "--sp", "2", *place, "-o", str(cfg), env=env)
    launch = ["launch", "--cluster", "cpu", "--nodes", "1", "--gpus-per-node", "2", "--config", str(cfg)]
    launch += ["--run-dir", str(tmp / "launch"), "--master-port", str(free_port()), "--"]
    t0 = time.perf_counter()
    dstk(*launch, __file__, "--worker", str(cfg), str(model_file), str(out), env=env)
    wall = time.perf_counter() - t0
    ranks = json.loads(out.read_text())
    print(f"ranks imported {ranks[0]['toolkit']}", flush=True)
    sp1, sp2 = ranks[0]["sp1"], [r["sp2"] for r in ranks]
    worst = max(r["total"] for r in sp2)
    return {
        "seq_length": seq_length,
        "model": {**MODEL, "seq_length": seq_length},
        "layout": [*LAYOUT, "--sp", "2"],
        "measured_sp1": sp1,
        "measured_sp2_per_rank": sp2,
        "ratio_sp2_over_sp1": worst / sp1["total"],
        "ratio_blocks": max(r["blocks"] for r in sp2) / sp1["blocks"],
        # as `dstk train` runs it (no recomputation), and without the a·s² softmax terms (what the cost model
        # prices for --recompute selective): SDPA's fused kernel stores no scores (see the Markdown)
        **{
            f"estimate_sp{sp}{suffix}": estimate_parts(model_file, sp, recompute)
            for sp in (1, 2)
            for suffix, recompute in (("", "none"), ("_no_scores", "selective"))
        },
        "launch_wall_s": wall,
    }


def _mib(x: float) -> str:
    return f"{x / 2**20:.2f}"


def report(r: dict[str, Any], command: str) -> list[str]:
    m1, m2 = r["measured_sp1"], r["measured_sp2_per_rank"]
    rows = [("sp=1", m1, r["estimate_sp1"], r["estimate_sp1_no_scores"])]
    rows += [(f"sp=2 rank {i}", m, r["estimate_sp2"], r["estimate_sp2_no_scores"]) for i, m in enumerate(m2)]
    lines = [
        f"# Ulysses activation memory per rank, seq {r['seq_length']} (tiny Llama, 2 CPU ranks, fp32)",
        "",
        f"Command: `{command}`",
        "",
        "MiB per rank. Estimate: `dstk estimate --json` `memory_per_gpu_bytes.activations` (blocks + logits "
        'term); "no scores": the same without the a·s² softmax terms (its `--recompute selective` figure).',
        "",
        "| | measured: blocks | rest | total | estimate: blocks | logits term | total | no scores: blocks | total |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m, e, f in rows:
        lines.append(
            f"| {name} | {_mib(m['blocks'])} | {_mib(m['other'])} | {_mib(m['total'])} | {_mib(e['blocks'])} | "
            f"{_mib(e['logits'])} | {_mib(e['total'])} | {_mib(f['blocks'])} | {_mib(f['total'])} |"
        )
    worst = max(m["blocks"] for m in m2)
    e1, e2 = r["estimate_sp1"]["blocks"], r["estimate_sp2"]["blocks"]
    f1, f2 = r["estimate_sp1_no_scores"]["blocks"], r["estimate_sp2_no_scores"]["blocks"]
    lines += [
        "",
        f"Measured sp=2 / sp=1 per rank: {r['ratio_sp2_over_sp1']:.3f} in all, {r['ratio_blocks']:.3f} in the "
        f"blocks (the estimate: 0.500). Measured / estimated blocks: {m1['blocks'] / e1:.3f} (sp=1) and "
        f"{worst / e2:.3f} (sp=2); without the scores {m1['blocks'] / f1:.3f} and {worst / f2:.3f}.",
        "",
        "Measured: bytes autograd saves for backward in one forward of one sequence (model and loss), distinct "
        'storages, parameters excluded; "rest" is the embedding output, final norm, LM head and loss. Where '
        "they differ: (1) SDPA's fused kernel never stores the softmax scores, a·s² per sequence and block "
        "(Korthikanti et al.; it keeps q, k, v, the output and a log-sum-exp), so the estimate leaves them out "
        "for HF models at `--recompute none` too (toolkit/plan/cost/activations.py `attention_recompute`; "
        "before 2026-12-04 it priced them, several times the measurement at this length). (2) "
        "Per block, sp=2 keeps one [s/sp, h] tensor more than half of sp=1's: the attention output is saved "
        "by SDPA (head-sharded) and, after the all-to-all back, by o_proj (sequence-sharded), where at sp=1 "
        "o_proj's input shares SDPA's output storage; the label and position slices are views of full-length "
        "tensors (a few KiB). (3) The estimate's logits term is the peak at the start of backward (12·s·V "
        "bytes: the saved fp32 log-softmax and two fp32 gradients "
        "backward creates), more than the loss saves in forward.",
    ]
    return lines


def main() -> int:
    from benchmarks.common import command_line, output_paths, write_record

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--out-dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dstk-sp-") as tmp:
        record = measure(args.seq_length, Path(tmp))
    record["command"] = command_line()
    paths = output_paths("sequence_parallel", args.out_dir)
    write_record(paths["json"], record)
    lines = report(record, record["command"])
    paths["md"].write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {paths['json']} and {paths['md']}")
    return 0


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher prepends it
    if argv[:1] == ["--worker"]:
        worker(argv[1], argv[2], argv[3])
        from toolkit.run.runtime import exit_without_teardown, shutdown

        shutdown()
        exit_without_teardown()  # as step_memory.py: gloo's teardown sometimes aborts
    else:
        sys.exit(main())
