"""Why `dstk data prepare` has nothing (or not enough) to write, in one line that names the flag to change.

A run that reads nothing usable must say so and why (which file, which kind of bad line, where the first one
is), not report a dict of zero drop counts or blame `--validation-fraction` for what the input did.
"""

from __future__ import annotations

from toolkit.data.read import InputReport

DROP_FLAGS = {
    "empty_after_cleaning": "--boilerplate",
    "language": "--languages",
    "too_few_words": "--min-words",
    "too_many_words": "--max-words",
    "symbol_ratio": "--max-symbol-ratio",
    "repetition": "--max-repetition",
    "exact_duplicate": "--dedup",
    "near_duplicate": "--dedup, --near-threshold",
    "mixing": "--mix, --temperature",
}
"""The flag that governs each drop reason (toolkit.data.prepare.STAGES), to name in an explanation."""
FORMATS = 'expected a JSON object with a "text" string per line (.jsonl files) or plain text (any other file)'


def nothing_kept(report: InputReport, read: int, files: int, dropped: dict[str, int]) -> str:
    """No document left after reading and filtering: because none could be read, or the filters took all."""
    if not read:
        if report.bad:
            return f"--input: no usable document: {report.summary()}; {FORMATS}"
        return f"--input: no document in {files} file{'s' * (files != 1)}: only blank lines"
    drops = ", ".join(f"{n} {reason} ({DROP_FLAGS[reason]})" for reason, n in dropped.items() if n)
    unusable = f"; besides, {report.summary()}" if report.bad else ""
    return f"--input: no document survived filtering: {read} read, dropped {drops}{unusable}"


def no_validation(
    report: InputReport, read: int, fraction: float, kept: int, seq_length: int, documents: int, tokens: int
) -> str:
    """`--validation-fraction` finds no validation row; when most input lines were unusable, that is the
    cause to name first."""
    shortfall = (
        f"{fraction:g} of {kept} documents leaves no validation row of {seq_length} tokens "
        f"({documents} documents, {tokens} tokens)"
    )
    if report.bad_lines > read:
        return (
            f"--input: {report.summary()}; the {kept} document{'s' * (kept != 1)} left: --validation-fraction "
            f"{shortfall}; fix the input, or use --validation-fraction 0"
        )
    unusable = f" (besides, {report.summary()})" if report.bad else ""
    return (
        f"--validation-fraction: {shortfall}; raise it, give more data, or use --validation-fraction 0"
        f"{unusable}"
    )
