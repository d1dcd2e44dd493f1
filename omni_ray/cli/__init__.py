"""The ``omni-ray`` command: one module per verb, each with ``add_arguments`` and ``run``.

The CLI only parses and calls the API function that tests also call. A user error (bad input)
is printed as one line on stderr with exit code 2; anything else keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> module under omni_ray.cli; verb modules import heavy packages inside run() only
VERBS = {
    "make-model": ("make_model", "build a synthetic Hugging Face model directory"),
    "doctor": ("doctor", "show versions and whether each vllm_omni patch is applied"),
    "topology": ("topology", "show NUMA nodes, cores, memory and the slots that would be made"),
    "quantize": ("quantize", "write a cpu_int4 (W4A16) checkpoint from a bf16 one"),
    "peers": ("peers", "build a peer engine (llama.cpp) and its GGUFs ahead of a sweep"),
    "stage": ("stage", "run one arm on one slot (no sweep file)"),
    "sweep": ("sweep", "run sweep files across every free slot"),
    "cluster": ("cluster", "start or stop a Ray cluster of simulated sockets on this machine"),
    "report": ("report", "write a self-contained HTML report (or tables) of result runs"),
    "compare": ("compare", "compare two runs metric by metric; exit 1 on a regression"),
    "retract": ("retract", "mark a result retracted in place, keeping its data"),
}


def user_error_types() -> tuple[type[BaseException], ...]:
    from omni_ray.errors import UserError
    from vllm_omni.errors import OmniInputError

    return (UserError, OmniInputError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni-ray", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, (module, help_text) in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        mod = importlib.import_module(f"omni_ray.cli.{module}")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except user_error_types() as exc:
        print(f"omni-ray {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"omni-ray {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
