"""The end of a run: what it measured, beside what `dstk estimate` predicted for the same layout."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from toolkit.plan.layout import Layout
from toolkit.plan.units import GIB, MIB
from toolkit.run.metrics import strict_json


def summarize(trainer: Any, run: Any, layout: Layout) -> dict[str, Any]:
    """Gather the measurements of every rank; rank 0 writes `summary.json` and prints the comparison."""
    meter = trainer.meter
    step_s = meter.step_time_s
    by_op = trainer.comms.per_step(len(meter.step_times))
    summary: dict[str, Any] = {
        "model": run.model.name,
        "layout": layout.model_dump(),
        "world_size": trainer.rt.world_size,
        "accelerator": trainer.rt.accelerator,
        "final_step": trainer.step,
        "stopped_by": trainer.stopped_by or None,
        "data_position": trainer.position,
        "losses": trainer.record.losses,
        "evals": trainer.record.evals,
        "step_time_s": step_s,
        "step_times_s": meter.step_times,
        "step_periods_s": meter.step_periods,
        **meter.rates(step_s),
        "peak_memory_bytes": trainer.peak_memory(),
        "peak_rss_bytes": trainer.peak_rss(),
        "param_norm": param_norm(trainer),
        "params_on_rank": _params_on_rank(trainer),
        "aux_losses": trainer.record.aux_losses,
        "comm_bytes_per_step": sum(by_op.values()),
        "comm_bytes_per_step_by_op": by_op,
        "comms_logger": trainer.comms.summary(),
        "model_state_bytes": trainer.record.model_states,
        "checkpoint_dir": str(run.checkpoint_dir) if run.checkpoint_dir else None,
        "data_start_position": getattr(trainer, "start_position", trainer.position),
        "stragglers": trainer.stragglers.report(),
        "save_errors": [asdict(e) for e in trainer.ckpt.errors] if trainer.ckpt is not None else [],
        "stopped_by_save_error": trainer.save_failed,
    }
    if trainer.ckpt is not None:
        summary["checkpoints"] = trainer.ckpt.report()
    if "nvme" in (layout.offload_optimizer, layout.offload_param):
        summary["offload_on_rank"] = _offload_on_rank(trainer, run.config)
    if getattr(run, "lora", None):
        summary["lora"] = {
            "spec": run.lora,
            "trainable_params": sum(
                getattr(p, "ds_numel", p.numel())
                for p in trainer.engine.module.parameters()
                if p.requires_grad
            ),
            "adapter_dir": str(run.run_dir / "adapter"),
            **getattr(trainer, "lora_changes", {}),
        }
    if run.cluster is not None:
        from toolkit.plan.cost.estimate import estimate
        from toolkit.run.data_fit import at_seq_length

        # priced at the data's sequence length, which is what trained (the model's may be longer)
        priced = at_seq_length(run.model, trainer.train_data.seq_length)
        predicted = estimate(priced, run.cluster, layout).to_dict()
        summary["predicted"] = predicted
    if trainer.rt.is_main:
        if run.cluster is not None:  # on rank 0 only: it may detect the host (nvidia-smi) again
            summary["warnings"] = reality_check(summary, run.cluster, layout)
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "summary.json").write_text(strict_json(summary, indent=2, sort_keys=True) + "\n")
        print_comparison(summary)
        for warning in summary.get("warnings", []):
            print(f"warning: {warning}", flush=True)
        if trainer.stopped_by:
            import signal

            name = signal.Signals(trainer.stopped_by).name
            where = f"; checkpoint {run.checkpoint_dir} at step {trainer.step}" if run.checkpoint_dir else ""
            print(f"stopped by {name} after step {trainer.step}{where}", flush=True)
    return summary


def param_norm(trainer: Any) -> float:
    """L2 norm of every fp32 parameter value, gathered across ZeRO-3 partitions — compares two runs' weights."""
    import deepspeed
    import torch

    from toolkit.run.runtime import settle_zero3

    params = list(trainer.engine.module.parameters())
    settle_zero3(trainer.engine)
    # one tensor at a time: with parameters on NVMe a gather takes one swap buffer per tensor, and there
    # are 5 ("Not enough buffers 5 for swapping 16", partitioned_param_swapper.py:310)
    total = 0.0
    for p in params:
        with deepspeed.zero.GatheredParameters([p], enabled=trainer.layout.zero_stage == 3):
            total += float(p.detach().double().pow(2).sum())
    return float(torch.sqrt(torch.tensor(total, dtype=torch.float64)))


OUTSIDE = (0.5, 2.0)
"""Measured/predicted ratios outside this band mean the description does not match the machine."""


def reality_check(summary: dict[str, Any], cluster: Any, layout: Layout) -> list[str]:
    """A warning per quantity whose measurement is outside ×0.5–2 of the prediction, naming the likely
    cause and the fix: bf16 emulated on this CPU, a preset that is not this machine, an uncalibrated local
    description, or other work on the host."""
    import os

    p = summary.get("predicted") or {}
    measured = {
        "step time": (summary.get("step_time_s"), p.get("step_time_s")),
        "peak memory": (
            max(summary.get("peak_memory_bytes") or [0]),
            (p.get("memory_per_gpu_bytes") or {}).get("total"),
        ),
    }
    off = {k: m / q for k, (m, q) in measured.items() if m and q and not OUTSIDE[0] <= m / q <= OUTSIDE[1]}
    if not off:
        return []
    causes = []
    if layout.precision == "bf16" and cluster.peak_flops("bf16") < cluster.peak_flops("fp32"):
        causes.append(
            "bf16 is slower than fp32 on this accelerator (emulated); plan fp32 (`--precision fp32`)"
        )
    if cluster.name != "local":
        causes.append(
            f"the cluster is the description {cluster.name!r}, not this machine: use `--cluster local` "
            "after `dstk calibrate`"
        )
    else:
        from toolkit.host.local import detect

        if detect(ranks=cluster.gpus_per_node).calibration is None:
            causes.append("--cluster local is not calibrated on this host: run `dstk calibrate`")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cores = os.cpu_count() or 1
    if load > cores + 0.5:
        causes.append(f"other jobs on the host (load average {load:.1f} on {cores} cores)")
    if not causes:
        causes.append(
            "other jobs on the host, or a model the cost model does not price; rerun `dstk calibrate`"
        )
    what = ", ".join(f"{k} ×{r:.2f} of the prediction" for k, r in off.items())
    return [f"measured {what} (outside ×{OUTSIDE[0]:g}–{OUTSIDE[1]:g}); likely: " + "; ".join(causes)]


def _params_on_rank(trainer: Any) -> list[dict[str, int]]:
    from toolkit.parallel.moe import count_rank_params
    from toolkit.run.loop_state import gather

    return gather(count_rank_params(trainer.engine.module))


def _offload_on_rank(trainer: Any, config: dict[str, Any]) -> list[dict[str, int]]:
    from toolkit.run.engine_state import offload_bytes
    from toolkit.run.loop_state import gather

    zero = config.get("zero_optimization") or {}
    paths = [(zero.get(k) or {}).get("nvme_path") for k in ("offload_optimizer", "offload_param")]
    path = next((p for p in paths if p), None)
    return gather(offload_bytes(trainer.engine, path, trainer.rt.rank))


def _row(name: str, measured: float, predicted: float | None, fmt: str) -> str:
    if predicted is None or predicted == 0:
        return f"  {name:<34}{format(measured, fmt):>14}{'-':>14}{'-':>9}"
    return f"  {name:<34}{format(measured, fmt):>14}{format(predicted, fmt):>14}{measured / predicted:>9.2f}"


def print_comparison(s: dict[str, Any]) -> None:
    p = s.get("predicted") or {}
    mem = p.get("memory_per_gpu_bytes", {})
    engine = p.get("engine_model_states_bytes", {})
    states = s["model_state_bytes"].get("after_backward") or s["model_state_bytes"].get("after_step") or [0]
    lines = [
        f"Measured vs predicted ({s['model']}, {s['world_size']} ranks, {s['accelerator']}; measured: the median step):",
        f"  {'':<34}{'measured':>14}{'predicted':>14}{'ratio':>9}",
        _row("step time (s)", s["step_time_s"], p.get("step_time_s"), ".4g"),
        _row("tokens/s", s["tokens_per_s"], p.get("tokens_per_s"), ",.0f"),
        _row("TFLOP/s per rank (model FLOPs)", s["tflops_per_gpu"], p.get("tflops_per_gpu"), ".4g"),
        *([_row("MFU", s["mfu"], p.get("mfu"), ".3f")] if "mfu" in s else []),
        _row(
            "peak memory per rank (GiB)",
            max(s["peak_memory_bytes"]) / GIB,
            mem.get("total", 0) / GIB or None,
            ".3f",
        ),
        _row("model states per rank (MiB)", max(states) / MIB, engine.get("total", 0) / MIB or None, ".2f"),
    ]
    if s["losses"]:
        lines.append(
            f"  loss: {s['losses'][0]:.4f} (step 1) -> {s['losses'][-1]:.4f} (step {s['final_step']})"
        )
    if s.get("checkpoint_dir"):
        lines.append(f"  checkpoints: {s['checkpoint_dir']}")
    print("\n".join(lines), flush=True)
