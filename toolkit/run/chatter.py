"""Library messages that tell a dstk user nothing, silenced once in every process that would print them: the
CLI, each rank of `dstk train`, each probe process of `dstk calibrate` (standard library only, so any entry
point may call it before the libraries are imported).

Measured on one `dstk calibrate` of 2 ranks before this existed: 24 such lines, each printed once per rank —
DeepSpeed's "Setting accelerator to CPU" on every import, torchao's failed CUDA kernel loads and torch's pytree
deprecations on any host without torchao's CUDA build (transformers imports torchao), torch's
`all_gather_into_tensor`/`reduce_scatter_tensor` deprecations (DeepSpeed's ZeRO calls them every step),
DeepSpeed's "get learning rate from scheduler before it has started" (logged by its own step before the
first scheduler step). What a user must see — errors, a first JIT build (announced with its duration by
`toolkit.run.jit`), dstk's own lines — is not touched.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any

QUIET_LOGGERS = ("torchao", "torch.utils._pytree")
"""Loggers of optional packages that speak when transformers imports them, not when dstk uses them: torchao (the
run extra, for --precision fp8) logs "Failed to load …/_C_mxfp8….so" and "Detected no triton" on any host
without its CUDA kernels, and torch's pytree warns about torchao's enum registrations. An fp8 run reports
torchao's own failures through toolkit/run/fp8.py's checks."""

DEEPSPEED_NOTICES = re.compile(
    r"Setting accelerator to CPU|Attempting to get learning rate from scheduler before it has started"
)
"""DeepSpeed log records dropped: the CPU accelerator is what `dstk env` and the run summary report, and the
scheduler notice is DeepSpeed's own call order."""

DEPRECATIONS = (r".*all_gather_into_tensor.* is deprecated", r".*reduce_scatter_tensor.* is deprecated")
"""torch FutureWarnings DeepSpeed's ZeRO triggers on every step, from every rank."""


class _Drop(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not DEEPSPEED_NOTICES.search(record.getMessage())


_DONE = False


def quiet() -> None:
    """Silence the above in this process (once; later calls do nothing)."""
    global _DONE
    if _DONE:
        return
    _DONE = True
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # DeepSpeed logs through the "DeepSpeed" logger it creates at import; a filter put on it first stays
    logging.getLogger("DeepSpeed").addFilter(_Drop())
    for message in DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


BUILT = re.compile(r"^DeepSpeed deepspeed\.ops\.\S+ built successfully$")
"""What DeepSpeed prints (print, not its logger) each time a rank loads a JIT op, built or cached."""


def init_distributed_quietly(init: Any) -> Any:
    """`init()` (deepspeed.init_distributed) with DeepSpeed's per-rank "… built successfully" lines left out of
    stdout; anything else it prints goes through."""
    import contextlib
    import io
    import sys

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            return init()
    finally:
        kept = [line for line in out.getvalue().splitlines() if not BUILT.match(line)]
        if kept:
            print("\n".join(kept), file=sys.stdout, flush=True)
