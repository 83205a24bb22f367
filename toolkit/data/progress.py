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

import sys
import time
from collections.abc import Sequence
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

    def close(self) -> None:
        """Remove the live bar (the summary comes with Progress.done)."""


class Progress:
    """Silent: stages are timed and counted, nothing is shown."""

    def stage(self, name: str, total: float | None = None, unit: str = "doc") -> Stage:
        return Stage()

    def done(self, stage: Stage, summary: str, notes: Sequence[str] = ()) -> None:
        stage.close()


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


def rate(count: float, seconds: float, unit: str) -> str:
    """`1,234 docs/s`, `5.6 MB/s`: what a stage's summary line reports."""
    per_s = count / max(seconds, 1e-9)
    return f"{per_s / 1e6:,.1f} MB/s" if unit == "B" else f"{per_s:,.0f} {unit}/s"


def count(n: int, noun: str) -> str:
    """`1 document`, `2,000 documents`."""
    return f"{n:,} {noun}{'s' * (n != 1)}"
