"""Peer engines that omni-ray's vLLM numbers are compared against (benchmark tooling only).

Nothing here runs in the test suite's slow path: a peer is built into ~/.cache/omni-ray on first
use, outside the project's virtualenv.
"""
