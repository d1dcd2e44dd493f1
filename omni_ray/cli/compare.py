"""omni-ray compare BASE NEW: per metric base and new medians, ratio and a verdict; exit 1 when
something regressed, 0 when nothing did."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", metavar="BASE", help="the run directory to compare against")
    p.add_argument("new", metavar="NEW", help="the run directory to judge")
    p.add_argument("--bands", default=None, metavar="FILE",
                   help="YAML/JSON mapping metric -> percent that counts as the same "
                        "(defaults: RssAnon 1.5, peaks 2, init/ready 12, decode/prefill 6, else 5)")


def run(args: argparse.Namespace) -> int:
    from omni_ray.report import compare_runs
    from omni_ray.report.comparison import to_text

    comparison = compare_runs(args.base, args.new, bands=args.bands)
    print(to_text(comparison), end="")
    return comparison.exit_code
