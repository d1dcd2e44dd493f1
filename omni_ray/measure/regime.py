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
_FLOATS = ("BF16", "F16", "F32")
_FLOAT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


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


# cpu_int4 quantized at load: vllm_omni's defaults (omni_ray.measure.speed_of_light, where a
# unit test checks them against vllm_omni's); vocab layers (embedding, head) are padded by vLLM.
_INT4_GROUP, _INT4_N_MULTIPLE = 128, 16
_VOCAB = ("embed_tokens", "lm_head")


def _int4_at_load(name: str, shape: list[int], dtype: str) -> int | None:
    """The bytes cpu_int4 keeps for a bf16 checkpoint tensor it quantizes at load (packed
    nibbles + bf16 scale and zero per group of K), or None when it stays as it is: not a 2-D
    linear weight, K not a multiple of the group, N not a multiple of 16 (a vocab layer's
    N is padded)."""
    if not name.endswith(".weight") or len(shape) != 2 or dtype not in ("BF16", "F16", "F32"):
        return None
    n, k = shape
    vocab = any(v in name for v in _VOCAB)
    if k % _INT4_GROUP or (not vocab and n % _INT4_N_MULTIPLE):
        return None
    return n * k // 2 + n * (k // _INT4_GROUP) * 2 * 2


def checkpoint_bytes_per_token(model_dir: str | os.PathLike, quantization: str | None = None,
                               dtype: str | None = None) -> int:
    """Weight bytes one decode token reads from a safetensors checkpoint (bf16 or cpu_int4).

    Every tensor counts once, except the input embedding of an untied model: a token reads one
    row of it (ignored here), while its output head is read whole. A tied embedding is the head,
    so it counts. ``quantization="cpu_int4"`` (or ``cpu_int4_a8``, the same weights) on a
    checkpoint that is not cpu_int4 already (a bf16 one quantized at load): the engine reads
    int4 bytes, so each linear weight it quantizes counts as int4 (``_int4_at_load``), the rest
    as stored. ``dtype`` (a stage's: ``bfloat16``, ``float16``, ``float32``): the engine casts
    floating tensors to it, so they count at its size (None: as stored).
    """
    cast = _FLOAT_BYTES.get(dtype or "")
    d = Path(model_dir)
    config = json.loads((d / "config.json").read_text())
    tied = bool(config.get("tie_word_embeddings", False))
    at_load = (quantization in ("cpu_int4", "cpu_int4_a8")
               and (config.get("quantization_config") or {}).get("quant_method") != "cpu_int4")
    total = 0
    for f in sorted(d.glob("*.safetensors")):
        for name, h in _header(f).items():
            if not tied and _EMBEDDING in name:
                continue
            int4 = _int4_at_load(name, h["shape"], h["dtype"]) if at_load else None
            if int4 is not None:
                total += int4
                continue
            n = 1
            for dim in h["shape"]:
                n *= dim
            size = cast if cast and h["dtype"] in _FLOATS else _DTYPE_BYTES[h["dtype"]]
            total += n * size
    return total


def describe(weight_bytes_per_token: int | None, llc_bytes: int | None) -> dict:
    """The fields a decode figure's record carries."""
    return {"decode_regime": regime(weight_bytes_per_token, llc_bytes),
            "decode_weight_bytes_per_token": weight_bytes_per_token,
            "llc_bytes": llc_bytes, "decode_regime_rule": RULE}
