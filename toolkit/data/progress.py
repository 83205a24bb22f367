"""How `dstk data prepare` says what it is doing: a live bar per stage on a terminal, a summary line per stage.

The library reports through a :class:`Progress` it is handed and never prints by itself; the default is
silent (library calls, `dstk train`'s default data). The CLI hands a :class:`Console`: on a terminal, a tqdm
bar per stage on stderr (documents/s, MB/s and an ETA where the total is known: input bytes, documents to
tokenize, rows to pack), cleared when the stage ends; always, one summary line per stage and the notes of that
stage on stderr, so a log file shows where a long run is and stdout stays the one result line.

A stage's summary and notes are printed only once the checks that follow it have passed (`Stage.done`): a run
that fails after reading prints its one error line, not a summary that the error then contradicts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO


class Stage:
    """One stage's live counters; silent unless a Console made it."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.documents = 0

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def advance(self, amount: float = 0, documents: int = 0) -> None:
        """`amount` more of the stage's unit done (bytes, documents or rows), `documents` more documents."""
        self.documents += documents

    def describe(self, text: str) -> None:
        """Rename what the bar shows (e.g. "tokenizer (merging)" once its sample is read)."""

    def retotal(self, total: float) -> None:
        """The stage's total, once it is known (how many documents the mixture keeps)."""

    def close(self) -> None:
        """Remove the live bar (the summary comes with Progress.done)."""


class Progress:
    """Silent: stages are timed and counted, nothing is shown."""

    def stage(self, name: str, total: float | None = None, unit: str = "doc") -> Stage:
        return Stage()

    def done(self, stage: Stage, summary: str, notes: Sequence[str] = ()) -> None:
        stage.close()

    def note(self, text: str) -> None:
        """Something the user should know now (a resumed run, an interrupted one)."""


class _Bar(Stage):
    def __init__(self, bar: Any, count_documents: bool) -> None:
        super().__init__()
        self.bar, self.count_documents = bar, count_documents

    def advance(self, amount: float = 0, documents: int = 0) -> None:
        super().advance(amount, documents)
        if documents and self.count_documents:  # a bar in bytes: documents and their rate beside it
            rate = self.documents / max(self.seconds, 1e-9)
            self.bar.set_postfix_str(f"{self.documents:,} docs, {rate:,.0f} docs/s", refresh=False)
        self.bar.update(amount)  # redraws (at most every refresh_s) with the postfix just set

    def describe(self, text: str) -> None:
        self.bar.set_description_str(text)

    def retotal(self, total: float) -> None:
        if self.bar.total != total:
            self.bar.total = total
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class Console(Progress):
    """Bars on a terminal (`live`, default: whether `stream` is one), summary lines and notes always."""

    def __init__(
        self, stream: TextIO | None = None, live: bool | None = None, refresh_s: float = 0.5
    ) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.refresh_s = refresh_s
        """Least time between two redraws of a bar."""

    def stage(self, name: str, total: float | None = None, unit: str = "doc") -> Stage:
        if not self.live:
            return Stage()
        from tqdm import tqdm

        bar = tqdm(
            total=total,
            desc=name,
            unit=unit if unit == "B" else f" {unit}s",
            unit_scale=True,
            unit_divisor=1000,
            leave=False,
            file=self.stream,
            dynamic_ncols=True,
            mininterval=self.refresh_s,
        )
        return _Bar(bar, count_documents=unit == "B")

    def done(self, stage: Stage, summary: str, notes: Sequence[str] = ()) -> None:
        stage.close()
        for line in (summary, *(f"note: {n}" for n in notes)):
            print(line, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        print(f"note: {text}", file=self.stream, flush=True)


class Heartbeat:
    """A task's progress in a small file (`amount documents [total]`), rewritten at most every `interval_s`
    and at the end: worker processes and SLURM tasks say how far they are, and the process showing the bar
    adds the files up (`read_heartbeats`). `total` is for a stage whose size only its task knows."""

    def __init__(self, path: Path, interval_s: float = 0.5) -> None:
        self.path, self.interval_s, self.last = path, interval_s, 0.0
        self.total: float | None = None
        path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, amount: float, documents: int, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.interval_s:
            self.last = now
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(
                f"{amount} {documents}" + (f" {self.total}" if self.total is not None else "") + "\n"
            )
            os.replace(tmp, self.path)


def read_heartbeats(folder: Path) -> tuple[float, int, float]:
    """(amount, documents, total) summed over the heartbeat files in `folder` (total 0: none said)."""
    amount, documents, total = 0.0, 0, 0.0
    for path in folder.glob("[!.]*") if folder.is_dir() else ():
        try:
            a, d, *t = path.read_text().split()
            amount, documents, total = amount + float(a), documents + int(d), total + sum(map(float, t))
        except (OSError, ValueError):  # being replaced this instant: counted at the next look
            continue
    return amount, documents, total


def rate(count: float, seconds: float, unit: str) -> str:
    """`1,234 docs/s`, `5.6 MB/s`: what a stage's summary line reports."""
    per_s = count / max(seconds, 1e-9)
    return f"{per_s / 1e6:,.1f} MB/s" if unit == "B" else f"{per_s:,.0f} {unit}/s"


def count(n: int, noun: str) -> str:
    """`1 document`, `2,000 documents`."""
    return f"{n:,} {noun}{'s' * (n != 1)}"
