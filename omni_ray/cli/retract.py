"""omni-ray retract RESULT --reason "...": mark a record file or a whole run directory
retracted in place (its data is kept); report and compare then strike it through."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("result", metavar="RESULT", help="a record file (*.pN.json) or a run directory")
    p.add_argument("--reason", required=True, help="why the result is wrong (kept in the record)")
    p.add_argument("--superseded-by", default=None, metavar="RESULT",
                   help="the record or run that replaces it")


def run(args: argparse.Namespace) -> int:
    from omni_ray.report import retract_result

    changed = retract_result(args.result, args.reason, args.superseded_by)
    print(f"retracted {len(changed)} record(s) in {args.result}")
    return 0
