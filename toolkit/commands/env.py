"""`dstk env`: library versions, accelerator and machine — stamped into every benchmark result."""

from __future__ import annotations

import argparse

from toolkit.commands import print_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from toolkit.report.render import field_lines
    from toolkit.run.environment import collect

    info = collect()
    if args.json:
        print_json(info)
        return 0
    local = info.pop("local_cluster")
    for key, value in info.items():
        if isinstance(value, dict):
            for k, v in value.items():
                print(f"{k:>14}: {v}")
        else:
            print(f"{key:>14}: {value}")
    print("\n--cluster local (detected from this machine):")
    for key, value in local["hardware"].items():
        print(f"{key:>14}: {value}")
    print(f"{'calibration':>14}: {local['calibration'] or 'none for this host (run dstk calibrate)'}")
    print("\n".join(field_lines(local["cluster"], local["sources"])))
    for line in local["unknown"]:
        print(f"  unknown: {line}")
    return 0
