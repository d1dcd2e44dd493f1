"""omni-ray make-model --shape NAME --out DIR: a synthetic HF model, no download.

Streams the weights to disk (a progress bar on stderr); refuses with one line and exit 2 when
the disk has less free space than the build writes. See docs/sizes.md.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from omni_ray.models.shapes import SHAPES

    p.add_argument("--shape", required=True, help=f"one of: {', '.join(SHAPES)}")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    tie = p.add_mutually_exclusive_group()
    tie.add_argument("--tie-embeddings", dest="tie", action="store_true", default=None,
                     help="share the output head with the embedding (the shape's default)")
    tie.add_argument("--untie", dest="tie", action="store_false",
                     help="write a separate lm_head")
    p.add_argument("--force", action="store_true",
                   help="rebuild even if up to date; replaces a non-empty OUT that make-model "
                        "did not write (its contents are deleted)")


def run(args: argparse.Namespace) -> int:
    import sys

    from omni_ray.models.build import build_model, get_shape

    shape = get_shape(args.shape)
    out = build_model(args.shape, args.out, seed=args.seed, tie_embeddings=args.tie,
                      force=args.force, progress=sys.stderr)
    tie = shape.tie_embeddings if args.tie is None else args.tie
    print(f"{out}: {shape.name}, {shape.num_parameters(tie) / 1e6:.1f}M parameters, "
          f"seed {args.seed}, {'tied' if tie else 'untied'} embeddings")
    return 0
