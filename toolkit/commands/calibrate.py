"""`dstk calibrate`: measure this machine with N local ranks and write a cluster description (YAML).

The result is cached per host fingerprint (toolkit.host.calibration_cache: CPU model and flags, cores, GPU model and
driver, rank count, torch/DeepSpeed versions) under the user's cache directory, where `--cluster local`
finds it. The probes are sized from a first tiny measurement, so the whole run takes under a minute on a
host whose bf16 is emulated as on one with native bf16, once DeepSpeed's CPU op is built (`make install`
builds it; otherwise the first calibration compiles it, said before it starts).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ranks", type=int, metavar="N", help="local ranks to measure with (default: as --cluster local)"
    )
    parser.add_argument("--name", default="calibrated", help="cluster name in the written file")
    parser.add_argument(
        "--nvme-path", type=Path, metavar="DIR", help="also measure write/read bandwidth here"
    )
    parser.add_argument(
        "--checkpoint-path",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="where checkpoints will go: write + fsync + SHA-256 of 64 MB there prices each save "
        "(storage_gb_per_s; default: the current directory)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="cluster YAML to write (the host's cache, which --cluster local reads, is written either way)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="when this host's cache already holds a calibration for these ranks, use it instead of measuring",
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the raw per-rank measurements as JSON"
    )


def _check(args: argparse.Namespace) -> None:
    """Every flag checked before a probe starts (and -o's place, so a measurement is never lost to it)."""
    from toolkit.errors import UserError

    if args.ranks is not None and not 1 <= args.ranks <= 1024:
        raise UserError(f"--ranks: {args.ranks} must be in 1 .. 1024")
    if args.nvme_path is not None and not args.nvme_path.is_dir():
        raise UserError(f"--nvme-path: {args.nvme_path} is not a directory")
    if not args.checkpoint_path.is_dir():
        raise UserError(f"--checkpoint-path: {args.checkpoint_path} is not a directory")
    if args.output:
        from toolkit.paths import output_file

        output_file(args.output, "-o")


def run(args: argparse.Namespace) -> int:
    from toolkit.commands import print_json
    from toolkit.host.calibration_cache import calibration_path
    from toolkit.host.local import detect

    _check(args)
    host = detect(ranks=args.ranks, use_cache=False)
    ranks = args.ranks or host.cluster["gpus_per_node"]
    cached = calibration_path(host.fingerprint)
    if args.reuse and cached.is_file():
        print(f"using this host's calibration {cached} (delete it or drop --reuse to measure again)")
        if args.output:
            _write(args.output, cached.read_text())
        return 0
    from toolkit.host.calibration import calibration_file
    from toolkit.run.calibrate import measure, storage_gb_per_s

    what = host.hardware.get("gpu") or host.hardware.get("cpu")
    start = time.monotonic()
    print(f"calibrating {what} with {ranks} ranks ...", flush=True)
    _announce_builds(host.cluster.get("accelerator", "cpu"))
    results = measure(ranks, str(args.nvme_path) if args.nvme_path else None)
    storage = storage_gb_per_s(args.checkpoint_path)
    took = time.monotonic() - start
    text = calibration_file(
        results, args.name, storage, ranks, took, f"{what}; fingerprint {host.fingerprint}"
    )
    _write(cached, text)
    if args.output:
        _write(args.output, text)
    if args.json:
        print_json(results)
    _say(results, took, args.output, cached)
    return 0


def _announce_builds(accelerator: str) -> None:
    """A first DeepSpeed op build is the probes' longest silence: said before it starts, with its length."""
    import os

    from toolkit.run.jit import announcement

    said = announcement(accelerator, None, dict(os.environ))
    if said:
        print(said, flush=True)


def _say(results: list[dict[str, Any]], took: float, output: Path | None, cached: Path) -> None:
    """What was measured and where it was written."""
    rates = results[0]["large_tflops"]
    print(
        f"measured in {took:.0f} s: "
        + ", ".join(f"{p} {v * 1e3:,.3g} GFLOP/s" for p, v in rates.items())
        + f" per rank; fastest precision {results[0]['precision']}"
    )
    print(f"wrote {output or cached}" + (f" and {cached}" if output else "") + "; --cluster local uses it")


def _write(path: Path, text: str) -> None:
    from toolkit.errors import UserError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        shutil.move(str(tmp), path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
