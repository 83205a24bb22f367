"""`dstk presets`: the model and cluster presets with their key figures, read from the preset files."""

from __future__ import annotations

import argparse

from toolkit.commands import print_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    from toolkit.host.local import load_cluster
    from toolkit.plan.load import load_model
    from toolkit.plan.presets import preset_names
    from toolkit.report.presets import preset_rows, print_presets

    models = [load_model(name) for name in preset_names("models")]
    clusters = [load_cluster(name) for name in preset_names("clusters")] + [load_cluster("local")]
    rows = preset_rows(models, clusters)
    if args.json:
        print_json(rows)
    else:
        print_presets(rows)
    return 0
