"""omni-ray sweep FILE [FILE ...]: run sweep files across every free slot of every socket."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", help="sweep YAML files (together they form one run)")
    p.add_argument("--address", default=None,
                   help="an existing Ray cluster (auto or HOST:PORT); default: start a local one")
    p.add_argument("--listen", default=None, metavar="IP",
                   help="a local Ray's node address, reachable from other machines (Ray then "
                        "binds every interface); default 127.0.0.1: every Ray port on loopback "
                        "only. The dashboard stays on 127.0.0.1")
    p.add_argument("--monitor", action="store_true",
                   help="run a local Prometheus (apt-get install prometheus) on Ray's metrics "
                        "while the sweep runs; prints a graph link per omni-ray metric")
    p.add_argument("--monitor-port", type=int, default=9090, metavar="PORT",
                   help="Prometheus's port on 127.0.0.1, or the next free one (default 9090)")
    p.add_argument("--out", default="results", help="results root (default: results)")
    p.add_argument("--passes", type=int, default=None, help="override every sweep's passes")
    p.add_argument("--resume", action="store_true",
                   help="continue the latest run: skip arm passes already recorded ok")
    p.add_argument("--dry-run", action="store_true", help="print the arms and slots; run nothing")
    p.add_argument("--allow-busy", action="store_true",
                   help="run on busy slots anyway; results are marked contended")
    p.add_argument("--busy-wait", type=float, default=30.0, metavar="S",
                   help="how long to wait for a busy slot before refusing (default 30)")
    p.add_argument("--no-report", action="store_true",
                   help="do not write RUN_DIR/report.html at the end (omni-ray report can later)")


def run(args: argparse.Namespace) -> int:
    import sys

    from omni_ray.api import run_sweep
    from omni_ray.cli.display import terminal_view

    with terminal_view(sys.stdout) as view:
        report = run_sweep(args.files, address=args.address, out=args.out,
                           resume=args.resume, passes=args.passes, dry_run=args.dry_run,
                           allow_busy=args.allow_busy, busy_wait_s=args.busy_wait,
                           listen=args.listen, monitor=args.monitor,
                           monitor_port=args.monitor_port, on_event=view)
    if args.dry_run:
        return 0
    if not args.no_report:
        write_reports(report.out_dirs.values())
    if report.refused:
        return 1
    return 1 if report.failed else 0


def write_reports(out_dirs) -> None:
    """The HTML report of each run directory, and where it is; a run without a readable record
    says why in one line instead (the sweep's own exit code stands)."""
    from omni_ray.errors import UserError
    from omni_ray.report import write_report

    for out_dir in out_dirs:
        try:
            print(f"report: {write_report([out_dir])}", flush=True)
        except UserError as e:
            print(f"report not written: {e}", flush=True)
