"""`dstk data prepare`: raw text → cleaned, deduplicated, filtered, mixed, tokenized and packed training
sequences (HF `datasets` Arrow, and/or Megatron .bin/.idx), with a manifest that accounts for every document,
on one process, N worker processes, or the nodes of a SLURM cluster — with the same bytes out.

The stages (toolkit.data.workdir) run on datatrove's executors (toolkit.data.engine):

1. filter, one task per shard (toolkit.data.shards): read (toolkit.data.formats: bad lines counted), clean
   (toolkit.data.clean), language and quality filters (toolkit.data.quality), survivors and their dedup keys
   written (toolkit.data.task_filter);
2. buckets and resolve: datatrove's MinHash bucket merge finds every pair of documents sharing a key across
   all shards; the later one is dropped (toolkit.data.task_dedup), as one process reading in order would;
3. tokenizer: a local one, or a byte-level BPE trained on a bounded sample of the survivors;
4. tokenize, one task per shard;
5. assemble (toolkit.data.assemble): per-domain token budgets (toolkit.data.mix), ~2 % to validation by a hash
   of the text, each split shuffled with the seed, then packed: documents joined by an end-of-text token,
   cut into rows of exactly `seq_length` tokens (the last row of each split padded, its real length kept in
   `n_tokens`), or with `--no-pack` a row per document (pieces of `seq_length` when longer); Megatron's
   files hold the same documents, one sequence each.

Every path is checked before any work (toolkit.data.paths): the inputs exist (each file read once, prepared
datasets inside an input folder skipped), `--out` is not inside an input folder and replaces an existing
dataset only with `--overwrite`, `--tokenizer` is a local tokenizer directory. The work happens in
`OUT/.dstk-work`, the new dataset is moved into place at the end, so an old dataset stays as it was until
then. When the data cannot give a dataset (nothing left, a --mix domain that does not exist) the run stops
with one line and leaves nothing; when it is interrupted or killed, the work done stays, and the same
command run again continues from the tasks already done.

The same inputs, options and seed give byte-identical files, whatever the number of tasks, workers or nodes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolkit.data.assemble import SPLITS, split_order
from toolkit.data.driver import DataError, Driver, Job
from toolkit.data.filter import filter_documents, is_validation
from toolkit.data.options import ExecutionOptions, PrepareOptions
from toolkit.data.pack import pack, pack_chunks
from toolkit.data.paths import MANIFEST, TOKENIZER, check_out, is_dataset
from toolkit.data.progress import Progress
from toolkit.data.read import expand_inputs, iter_records
from toolkit.data.workdir import WORK
from toolkit.errors import UserError
from toolkit.launcher.lock import claim_folder

# callers have always imported these from here
__all__ = [
    "MANIFEST",
    "ExecutionOptions",
    "PrepareOptions",
    "filter_documents",
    "is_validation",
    "iter_documents",
    "pack",
    "pack_chunks",
    "prepare",
    "split_order",
]


def iter_documents(paths: list[Path], stats: dict[str, int]) -> Iterator[str]:
    """Texts of every document; unreadable or malformed lines are counted in `stats`, never fatal."""
    for record in iter_records(paths, stats):
        yield record.text


def prepare(
    inputs: list[Path],
    out: Path,
    seq_length: int,
    *,
    tokenizer: Path | None = None,
    vocab_size: int | None = None,
    validation_fraction: float = 0.02,
    seed: int = 0,
    options: PrepareOptions | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    execution: ExecutionOptions | None = None,
) -> dict[str, Any]:
    """Run the pipeline on `inputs` into `out` (train/, validation/ and/or megatron/, tokenizer/,
    manifest.json). `overwrite` allows replacing a dataset already in `out`; `progress` is told about each
    stage; `execution` says where the tasks run (default: this machine's cores)."""
    import datasets

    datasets.disable_progress_bars()
    if (tokenizer is None) == (vocab_size is None):
        raise UserError(
            "--tokenizer/--train-tokenizer: give exactly one (a local tokenizer dir, or a vocab size)"
        )
    if not 0 <= validation_fraction < 1:
        raise UserError(f"--validation-fraction: {validation_fraction} must be in [0, 1)")
    # every path before any work: a mistake costs milliseconds and writes nothing
    notes: list[str] = []
    files = expand_inputs(inputs, notes)
    check_out(out, [p for p in inputs if p.is_dir()], overwrite)
    if tokenizer is not None:
        from toolkit.data.tokenizer import load_tokenizer

        if load_tokenizer(tokenizer).eos_token_id is None:
            raise UserError(f"--tokenizer: {tokenizer} has no eos_token to separate documents")
    execution = execution or ExecutionOptions()
    if execution.executor == "slurm":
        from toolkit.data.engine import check_slurm

        check_slurm(out, execution)
    if is_dataset(out):
        notes.append(f"--overwrite: the dataset in {out} is replaced once the new one is complete")
    job = Job(
        inputs, files, out, seq_length, tokenizer, vocab_size, validation_fraction, seed,
        options or PrepareOptions(), execution, progress or Progress(), notes,
    )  # fmt: skip
    created = not out.exists()
    lock = claim_folder(out, "--out", overwrite, "the dataset", own=(WORK,))  # one job's
    driver = Driver(job)
    try:
        with _tokenizer_threads(driver.threads):
            manifest = driver.run()
        _install(driver.dataset, out)
        shutil.rmtree(out / WORK, ignore_errors=True)
        return manifest
    except DataError:  # the flags must change: the work is no use to the next command
        shutil.rmtree(out if created else out / WORK, ignore_errors=True)
        raise
    except BaseException:
        driver.stopped()
        raise
    finally:
        lock.release()


@contextmanager
def _tokenizer_threads(threads: int) -> Iterator[None]:
    """HF tokenizers in this process and the workers it starts: one thread unless a step says otherwise
    (toolkit.data.task_tokens.parallelism), a Rayon pool of `threads` (read once, at its first use)."""
    saved = {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _install(new: Path, out: Path) -> None:
    """Move the finished dataset into `out`, replacing an old one's parts; its manifest goes first and comes
    back last, so an interrupted swap never looks like a complete dataset."""
    (out / MANIFEST).unlink(missing_ok=True)
    for name in (TOKENIZER, *SPLITS, "megatron"):
        old = out / name
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        elif old.exists() or old.is_symlink():
            old.unlink()
        if (new / name).exists():
            (new / name).rename(old)
    (new / MANIFEST).rename(out / MANIFEST)
