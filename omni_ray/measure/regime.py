"""Which memory a decode figure is bound by: the last-level cache or DRAM.

A decode step at batch 1 reads every weight once. When those bytes fit in the last-level cache
the CPUs share, the weights stay there from token to token and decode runs at cache speed
(``cache-resident``); when they do not, each token streams them from DRAM (``DRAM-bound``). The
two differ several-fold, so a tok/s figure, and its share of a bandwidth bound, means nothing
without the regime: a ``tiny`` model (3.4 MB) on a 32 MiB L3 is cache-resident, a
``qwen2.5-0.5b`` (773 MB) is not.

The rule is the simplest one that holds at the extremes: cache-resident when the weight bytes
per token are at most the LLC bytes the CPUs reach, DRAM-bound otherwise. Close to the line
(within 2x either way) neither is the whole story; the record keeps both numbers.

Pure: the weight bytes come from safetensors headers (JSON) and config.json; no torch.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

CACHE_RESIDENT = "cache-resident"
DRAM_BOUND = "DRAM-bound"
RULE = "cache-resident when weight bytes per token <= LLC bytes of the CPUs used"

_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1, "I8": 1, "I16": 2,
                "I32": 4, "I64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_EMBEDDING = "embed_tokens."


def regime(weight_bytes_per_token: int | None, llc_bytes: int | None) -> str | None:
    """``cache-resident`` or ``DRAM-bound``; None when either number is unknown."""
    if not weight_bytes_per_token or not llc_bytes:
        return None
    return CACHE_RESIDENT if weight_bytes_per_token <= llc_bytes else DRAM_BOUND


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def checkpoint_bytes_per_token(model_dir: str | os.PathLike) -> int:
    """Weight bytes one decode token reads from a safetensors checkpoint (bf16 or cpu_int4).

    Every tensor counts once, except the input embedding of an untied model: a token reads one
    row of it (ignored here), while its output head is read whole. A tied embedding is the head,
    so it counts.
    """
    d = Path(model_dir)
    config = json.loads((d / "config.json").read_text())
    tied = bool(config.get("tie_word_embeddings", False))
    total = 0
    for f in sorted(d.glob("*.safetensors")):
        for name, h in _header(f).items():
            if not tied and _EMBEDDING in name:
                continue
            n = 1
            for dim in h["shape"]:
                n *= dim
            total += n * _DTYPE_BYTES[h["dtype"]]
    return total


def describe(weight_bytes_per_token: int | None, llc_bytes: int | None) -> dict:
    """The fields a decode figure's record carries."""
    return {"decode_regime": regime(weight_bytes_per_token, llc_bytes),
            "decode_weight_bytes_per_token": weight_bytes_per_token,
            "llc_bytes": llc_bytes, "decode_regime_rule": RULE}
