"""omni-ray report RUN_DIR... : a self-contained HTML report (or md/csv/json tables) of runs;
``omni-ray report RESULTS_ROOT --index`` writes RESULTS_ROOT/INDEX.md instead."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="run directories (results/SWEEP/RUN_ID), or with --index the results root")
    p.add_argument("--out", default=None,
                   help="directory (or file name) to write to; '-' prints to stdout; default: "
                        "RUN_DIR/report.FORMAT for one run, ./report.FORMAT for several")
    p.add_argument("--format", default="html", choices=("html", "md", "csv", "json"),
                   help="html (default): one file, charts inlined; md, csv, json: the tables")
    p.add_argument("--baseline", default=None, metavar="ARM",
                   help="arm label or id to divide by (adds a ratio column); never a retracted arm")
    p.add_argument("--index", action="store_true",
                   help="write an index of every run under the one directory given (INDEX.md)")


def run(args: argparse.Namespace) -> int:
    from omni_ray.errors import UserError
    from omni_ray.report import write_index, write_report
    from omni_ray.report.document import render
    from omni_ray.report.run import load_run

    if args.index:
        if len(args.runs) != 1:
            raise UserError("--index takes one results directory, got "
                            f"{len(args.runs)}: {' '.join(args.runs)}")
        print(f"index: {write_index(args.runs[0])}")
        return 0
    if args.out == "-":
        sys.stdout.write(render([load_run(d) for d in args.runs], args.format, args.baseline))
        return 0
    path = write_report(args.runs, out=args.out, form=args.format, baseline=args.baseline)
    print(f"report: {path}")
    return 0
