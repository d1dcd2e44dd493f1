"""python -m vllm_omni.patches.upstream check|keep [NAME...] (see the package docstring)."""

from __future__ import annotations

import argparse
import sys

from vllm_omni.patches import upstream


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_omni.patches.upstream",
                                description=upstream.__doc__.splitlines()[0])
    p.add_argument("action", choices=["check", "keep"],
                   help="check: diff each changed function; keep: store the installed sources")
    p.add_argument("names", nargs="*", help="dotted paths (default: every fingerprinted one)")
    args = p.parse_args(argv)
    known = upstream.replicated()
    unknown = [n for n in args.names if n not in known]
    if unknown:
        p.error(f"not a fingerprinted function: {', '.join(unknown)}")
    names = {n: known[n] for n in args.names} if args.names else known
    if args.action == "keep":
        for name in names:
            print(upstream.keep(name))
        return 0
    found = upstream.changes(names)
    for change in found:
        print(f"CHANGED {change.name}: fingerprint {change.expected} in the patch, "
              f"{change.found or 'unreadable'} installed")
        sys.stdout.write(change.diff)
    print(f"{len(names) - len(found)} of {len(names)} fingerprinted functions unchanged")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
