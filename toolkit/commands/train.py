"""`dstk train`: train a model description with a DeepSpeed config on the ranks a launcher started.

Run it through `dstk launch` (or the `deepspeed` launcher directly); alone it is a one-rank job.
"""

from __future__ import annotations

import argparse

from toolkit.run.train_flags import PREFLIGHT_DONE, add_train_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_train_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Check everything a rank would meet (toolkit.run.preflight), then train (toolkit.run.session)."""
    import os

    from toolkit.run.runtime import keep_large_blocks_in_mmap
    from toolkit.run.stop import StopRequest

    StopRequest.listen_early()  # SLURM's time-limit warning may come while the rank starts up
    keep_large_blocks_in_mmap()  # before torch is imported: see its docstring

    from toolkit.run.folders import claim_on_rank
    from toolkit.run.preflight import prepare_run
    from toolkit.run.runtime import adopt_slurm_task
    from toolkit.run.session import main

    adopt_slurm_task()  # a rank srun started knows its place from SLURM's variables
    run, notes = prepare_run(args, world=int(os.environ.get("WORLD_SIZE", "1")))
    held = claim_on_rank(args)  # rank 0: the run and checkpoint folders are this job's (or its launcher's)
    if os.environ.get("RANK", "0") == "0" and not os.environ.get(PREFLIGHT_DONE):
        from toolkit.run.jit import announcement

        build = announcement(run.cluster.accelerator if run.cluster else "cpu", run.config, dict(os.environ))
        for note in [*notes, *([build] if build else [])]:  # dstk launch said them when it set PREFLIGHT_DONE
            print(f"dstk train: note: {note}", flush=True)
    for note in held:
        print(f"dstk train: note: {note}", flush=True)
    os.environ.setdefault("WANDB_MODE", "offline")  # offline unless the user configured wandb
    summary = main(run)
    # stopped by a signal (at a step boundary, checkpoint written): 128 + the signal, the shell convention; a
    # stop that came with the last step stopped nothing (a SLURM job must not requeue a finished run)
    stopped = summary.get("stopped_by") and summary["final_step"] < run.loop.steps
    code = 128 + summary["stopped_by"] if stopped else 0
    errors = summary.get("save_errors") or []
    if not code and (
        summary.get("stopped_by_save_error") or (errors and errors[-1]["step"] >= summary["final_step"])
    ):
        code = 1  # the run's final state is in no complete checkpoint (toolkit.run.save_errors said why)
    if "LOCAL_RANK" in os.environ:
        from toolkit.run.runtime import exit_without_teardown

        exit_without_teardown(code)
    return code
