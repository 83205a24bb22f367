"""Run under the deepspeed launcher (2 gloo ranks): the dstk 1-bit optimizers inside the real DeepSpeed engine.

One process trains the same tiny GPT-2 (same initial weights, same per-rank data: a random Markov chain whose
loss floor is ln 2) several times:

- `adamw`: torch.optim.AdamW as client optimizer, the engine's own gradient all-reduce on (the reference);
- `onebit`: 1-bit Adam (`--freeze-step`) attached with `attach_to_engine`; checkpoint at `--ckpt-step`;
- `onebit_resumed`: a fresh engine loads that checkpoint (plus each rank's `rank_state`) and continues;
- `zero_one` / `zero_one_resumed`: the same for 0/1 Adam with short local-step intervals, the checkpoint
  taken between two synchronisations (parameters differ between ranks there);
- `bf16`: 1-bit Adam under bf16, where DeepSpeed wraps it in FP16_UnfusedOptimizer.

Writes OUT/result.json (rank 0) with per-step rank-averaged losses, final evaluation losses, wire bytes
and the checks that need both ranks.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from toolkit.run.runtime import init_distributed, shutdown

VOCAB, SEQ, MICRO, LR = 256, 32, 4, 3e-3
STATES, SUCCESSORS = 16, 2


def tiny_gpt2() -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0
    )
    cfg.attn_pdrop = 0.0
    return GPT2LMHeadModel(cfg)


def markov(n: int, seed: int) -> Any:
    """`n` sequences of a random Markov chain over the first STATES tokens, each with SUCCESSORS equally
    likely next tokens: learnable, with a known loss floor of ln(SUCCESSORS) after the first token."""
    import torch

    table = torch.Generator().manual_seed(7)
    succ = torch.stack([torch.randperm(STATES, generator=table)[:SUCCESSORS] for _ in range(STATES)])
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n, SEQ, dtype=torch.long)
    x[:, 0] = torch.randint(0, STATES, (n,), generator=g)
    for i in range(1, SEQ):
        x[:, i] = succ[x[:, i - 1], torch.randint(0, SUCCESSORS, (n,), generator=g)]
    return x


def batch(step: int, rank: int, world: int) -> Any:
    """This rank's micro-batch at `step`: a function of (step, rank) only, so a resumed run sees the same."""
    return markov(MICRO, seed=step * world + rank)


def ds_config(bf16: bool = False) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 0},
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
    }


def make_engine(spec: dict[str, Any] | None, bf16: bool = False) -> tuple[Any, Any]:
    import deepspeed
    import torch

    from toolkit.parallel.onebit import attach_to_engine, build_optimizer

    model = tiny_gpt2()
    if spec is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    else:
        optimizer = build_optimizer(model.parameters(), spec)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(bf16))
    return engine, (attach_to_engine(engine) if spec is not None else optimizer)


def mean_over_ranks(value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def train(engine: Any, optimizer: Any, first: int, last: int, rank: int, world: int) -> dict[str, Any]:
    """Steps first..last (1-based); per-step rank-mean loss and the optimizer's wire bytes per step."""
    losses, wire = [], []
    for step in range(first, last + 1):
        ids = batch(step, rank, world).to(engine.device)
        before = getattr(optimizer, "wire", None)
        sent = before.bytes if before is not None else 0.0
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(mean_over_ranks(float(loss.detach().float())))
        wire.append((optimizer.wire.bytes - sent) if before is not None else None)
    return {"losses": losses, "wire_bytes": wire}


def evaluate(engine: Any) -> float:
    import torch

    with torch.no_grad():
        ids = markov(64, seed=-1 % 2**31).to(engine.device)
        return float(engine.module(input_ids=ids, labels=ids).loss.float())


def param_digest(engine: Any) -> dict[str, Any]:
    """This rank's parameters (fp32 values), and whether all ranks hold the same ones."""
    import torch
    import torch.distributed as dist

    flat = torch.cat([p.detach().float().reshape(-1) for p in engine.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return {"flat": flat, "ranks_identical": all(torch.equal(g, gathered[0]) for g in gathered)}


def run_with_checkpoint(name: str, spec: dict[str, Any], args: argparse.Namespace, rt: Any) -> dict[str, Any]:
    """Train to args.steps saving at args.ckpt_step; then a fresh engine resumes from the checkpoint."""
    import torch

    ckpt = args.out / f"ckpt_{name}"
    tag = f"step{args.ckpt_step}"
    engine, opt = make_engine(spec)
    first = train(engine, opt, 1, args.ckpt_step, rt.rank, rt.world_size)
    engine.save_checkpoint(str(ckpt), tag=tag)
    torch.save(opt.rank_state(), ckpt / tag / f"onebit_rank{rt.rank}.pt")
    second = train(engine, opt, args.ckpt_step + 1, args.steps, rt.rank, rt.world_size)
    straight = param_digest(engine)
    result = {
        "losses": first["losses"] + second["losses"],
        "wire_bytes": first["wire_bytes"] + second["wire_bytes"],
        "eval_loss": evaluate(engine),
        "ranks_identical": straight["ranks_identical"],
    }

    engine, opt = make_engine(spec)
    engine.load_checkpoint(str(ckpt), tag=tag)
    opt.load_rank_state(torch.load(ckpt / tag / f"onebit_rank{rt.rank}.pt", weights_only=False))
    resumed = train(engine, opt, args.ckpt_step + 1, args.steps, rt.rank, rt.world_size)
    digest = param_digest(engine)
    result["resumed_losses"] = resumed["losses"]
    result["resumed_params_equal"] = bool(torch.equal(digest["flat"], straight["flat"]))
    result["resumed_params_max_diff"] = float((digest["flat"] - straight["flat"]).abs().max())
    return result


def bf16_run(args: argparse.Namespace, rt: Any) -> dict[str, Any]:
    import torch

    spec = {"type": "onebit-adam", "params": {"lr": LR, "freeze_step": 5, "weight_decay": 0.1}}
    engine, opt = make_engine(spec, bf16=True)
    masters = [p for g in opt.param_groups for p in g["params"]]
    model_params = list(engine.module.parameters())
    info = {
        "wrapper": type(engine.optimizer).__name__,
        "master_dtypes": sorted({str(p.dtype) for p in masters}),
        "model_dtypes": sorted({str(p.dtype) for p in model_params}),
        "state_after_attach": len(opt.state),
        "masters_equal_model": all(
            torch.equal(m, p.float()) for m, p in zip(masters, model_params, strict=True)
        ),
        "backward_allreduce": engine.enable_backward_allreduce,
    }
    info.update(train(engine, opt, 1, 15, rt.rank, rt.world_size))
    info["step_after_training"] = opt.state[masters[0]]["step"]
    info["ranks_identical"] = param_digest(engine)["ranks_identical"]
    return info


def attach_refusals(adamw_engine: Any) -> dict[str, str]:
    """What attach_to_engine says about engines it cannot serve: a torch optimizer, ZeRO stage 1."""
    import deepspeed

    from toolkit.parallel.onebit import attach_to_engine, build_optimizer

    said = {}
    try:
        attach_to_engine(adamw_engine)
    except TypeError as e:
        said["adamw"] = str(e)
    model = tiny_gpt2()
    optimizer = build_optimizer(model.parameters(), {"type": "onebit-adam", "params": {"lr": LR}})
    cfg = {**ds_config(), "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg)
    try:
        attach_to_engine(engine)
    except ValueError as e:
        said["zero1"] = str(e)
    return said


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ckpt-step", type=int, default=26)
    parser.add_argument("--freeze-step", type=int, default=12)
    args = parser.parse_args()
    rt = init_distributed()
    from toolkit.parallel.onebit_comm import ring_allreduce_bytes

    adam = {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    onebit = {"type": "onebit-adam", "params": {**adam, "freeze_step": args.freeze_step}}
    zero_one = {
        "type": "zero-one-adam",
        "params": {
            **adam,
            "var_freeze_step": args.freeze_step,
            "var_update_scaler": 4,  # variance updates at steps 1-4, 6, 8, 10, 12; 1-bit gradients between
            "local_step_scaler": 4,
            "local_step_clipper": 4,
        },
    }
    results: dict[str, Any] = {"world_size": rt.world_size, "loss_floor": math.log(SUCCESSORS)}
    engine, opt = make_engine(None)
    results["adamw"] = train(engine, opt, 1, args.steps, rt.rank, rt.world_size)
    results["adamw"]["eval_loss"] = evaluate(engine)
    results["attach_refusals"] = attach_refusals(engine)
    n_params = sum(p.numel() for p in engine.module.parameters())
    results["n_params"] = n_params
    results["fp16_ring_allreduce_bytes"] = ring_allreduce_bytes(n_params, rt.world_size, 2)
    results["fp32_ring_allreduce_bytes"] = ring_allreduce_bytes(n_params, rt.world_size, 4)
    results["onebit"] = run_with_checkpoint("onebit", onebit, args, rt)
    results["zero_one"] = run_with_checkpoint("zero_one", zero_one, args, rt)
    results["bf16"] = bf16_run(args, rt)
    if rt.rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    shutdown()


if __name__ == "__main__":
    main()
    from toolkit.run.runtime import exit_without_teardown

    exit_without_teardown()  # gloo's teardown aborts ~1 exit in 15 ("terminate called ..."), failing the job
