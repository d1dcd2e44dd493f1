"""KV cache budget arithmetic from a model's config.json (no vLLM import)."""

from __future__ import annotations

import json
from pathlib import Path

MiB = 1 << 20
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_bytes_per_token(model_dir: str | Path, dtype: str = "bfloat16") -> int:
    """Bytes of K and V for one token over all layers: 2 x layers x kv_heads x head_dim x size."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[dtype]


def budget_problem(stage) -> str | None:
    """Why a stage's KV budget cannot work here (checked before an engine starts), or None.
    An engine without an explicit budget (llama.cpp, transformers) has nothing to check."""
    import psutil

    if stage.kv_cache_mib is None:
        return None

    from omni_ray.models.build import resolve_model

    per_token = kv_bytes_per_token(resolve_model(stage.model), stage.dtype)
    return check_budget(stage.kv_cache_mib, per_token=per_token,
                        max_model_len=stage.max_model_len,
                        free_mib=psutil.virtual_memory().available / MiB)


def check_budget(kv_cache_mib: int, *, per_token: int, max_model_len: int,
                 free_mib: float | None) -> str | None:
    """Why this budget cannot work, or None. Checked before an engine is started."""
    need = per_token * max_model_len
    if kv_cache_mib * MiB < need:
        return (f"kv_cache_mib: {kv_cache_mib} MiB holds {kv_cache_mib * MiB // per_token} tokens, "
                f"fewer than one sequence of max_model_len={max_model_len} "
                f"({need / MiB:.1f} MiB at {per_token} bytes/token)")
    if free_mib is not None and kv_cache_mib > free_mib:
        return (f"kv_cache_mib: {kv_cache_mib} MiB is more than the node's available memory "
                f"({free_mib:.0f} MiB)")
    return None
