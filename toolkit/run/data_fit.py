"""What the pre-flight knows about the data against the job before any rank starts (no torch): rows against
one global batch, how often `--steps` reads the data through, and the data's sequence length against the
model's.

Each was found late before: data smaller than one global batch failed on every rank after start-up (two
25-line tracebacks, 43 s in); a run past the data's end repeated it without a word; a run summary priced the
model's `seq_length` while the rows were shorter, and its tokens/s came out ×0.51 with no warning.
"""

from __future__ import annotations

from typing import Any

from toolkit.errors import UserError


def check_rows(data: Any, manifest: dict[str, Any], global_batch: int | None, token_budget: bool) -> None:
    """One global batch must fit in the training split (the loader draws each step's rows from one epoch)."""
    rows = int((manifest.get("rows") or {}).get("train") or 0)
    if global_batch is None or token_budget or rows >= global_batch:
        return
    raise UserError(
        f"--data: {data} holds {rows} training sequences, fewer than one global batch of {global_batch} (the "
        f"config's train_batch_size); prepare more data, or a config with --global-batch {rows} or less"
    )


def epochs_note(
    manifest: dict[str, Any], global_batch: int | None, steps: int, token_budget: bool
) -> str | None:
    """A sentence when `--steps` reads the training split more than once (each pass in a new order)."""
    rows = int((manifest.get("rows") or {}).get("train") or 0)
    if not rows or global_batch is None or token_budget:
        return None
    per_epoch = rows // global_batch
    if steps <= per_epoch:
        return None
    return (
        f"--steps {steps} reads the data {steps / per_epoch:.1f} times: {rows} training sequences make "
        f"{per_epoch} steps of {global_batch}, so from step {per_epoch + 1} it repeats (reshuffled each pass)"
    )


def seq_length_note(model: Any, manifest: dict[str, Any]) -> str | None:
    """A sentence when the data's rows are not the model's training length: the run's prediction (summary)
    prices the data's, which is what trains."""
    data_len = manifest.get("seq_length")
    if not isinstance(data_len, int) or data_len == model.seq_length:
        return None
    return (
        f"--data: its sequences are {data_len} tokens and {model.name}'s seq_length is {model.seq_length}: the "
        f"run trains on {data_len}, and its measured-vs-predicted summary prices {data_len}"
    )


def at_seq_length(model: Any, seq_length: int) -> Any:
    """The model description at the sequence length the data trains it at: what the run's FLOPs per token
    and its prediction are counted at (attention grows with the sequence)."""
    if seq_length == model.seq_length:
        return model
    return model.model_copy(update={"seq_length": seq_length})
