"""``torch.ops.vllm_omni.cpu_int4_linear``: the W4A16 linear, one custom op opaque to torch.compile.

With one of vllm_omni's native kernel sets (:mod:`vllm_omni.ops.native`: amx, avx512bf16,
avx512, avx2 or portable), below ``row_threshold`` rows (decode) it runs the int4 GEMV on the
packed weight, at or above it (prefill) the int4 GEMM, which takes the same integer dot products
register-blocked over several rows of x: both give the same bits for a row, so the threshold is a
matter of speed only.
The op's CPU kernel is then the set's C++ twin of :func:`cpu_int4_linear` (same branches, same
values, no Python per call). Otherwise the Python function here is the kernel: decode runs torch's
``_weight_int4pack_mm_for_cpu`` where torch's build reads vllm_omni's layout
(:func:`int4_pack.torch_reads_pack`, full 64-row blocks only); prefill, and decode elsewhere,
dequantize the pack to bf16 W^T chunk by chunk for a bf16 matmul (slower, still correct, other
rounding). From ``dequant_rows`` rows on (0: never), W4A16 takes that last way with a native
set too (:func:`dequant_mm`: the amx and avx512bf16 sets' ``int4_tile_mm`` dequantizes straight
into the layout AMX bf16 tiles or AVX512_BF16 registers read and multiplies there; the other
sets' ``int4_dequant_mm`` keeps chunks of W^T in cache for torch's bf16 matmul): faster than the
integer GEMM for long prompts on a CPU with bf16 products, with the
rounding of a bf16 linear on the dequantized weights (fp32 sums), not the GEMV's bits.
``activation_bits`` 8 is W4A8 (``csrc/int4_base.h``): x rounded to int8 per group before the
products, which the avx512 and avx2 sets take four at a time; the Python kernels round x the
same way (to bf16 afterwards) and multiply as above. Being one opaque op, the branch on the row
count is taken at run time and never becomes a torch.compile guard; ``group_size``,
``row_threshold``, ``activation_bits`` and ``dequant_rows`` are arguments, so they are constants
of the traced graph and must be part of the quantization config (which keys vLLM's compile
cache).

No ``from __future__ import annotations`` here: ``infer_schema`` reads the real annotations.
"""

import threading
from typing import Optional

import torch
from torch.library import Library

from vllm_omni.ops import int4_pack, native

NAMESPACE = "vllm_omni"
OP_NAME = "cpu_int4_linear"
# The library must outlive every use of the op (it is the op's registration).
_LIB = Library(NAMESPACE, "FRAGMENT")
_lock = threading.Lock()
_KERNELS: Optional[str] = None  # set by register()


ACTIVATION_BITS = (16, 8)


def int8_activations(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """x [M, K] rounded as W4A8 rounds it, per group of ``group_size``: round(x / step) times
    step = max|x| / 127, in bf16 (a divide, not the kernels' multiply by 127 / max|x|, which a
    max|x| under ~4e-37 would take to infinity; the ties may round otherwise)."""
    xg = x.float().reshape(x.shape[0], -1, group_size)
    amax = xg.abs().amax(-1, keepdim=True)
    step = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    codes = torch.round(xg / step).clamp_(-127, 127)
    return (codes * step).reshape(x.shape).to(torch.bfloat16)


def cpu_int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                    group_size: int, row_threshold: int,
                    bias: Optional[torch.Tensor] = None,
                    activation_bits: int = 16, dequant_rows: int = 0) -> torch.Tensor:
    """y = x @ W^T (+ bias), W [N, K] in vllm_omni's int4 layout; x [..., K] -> y [..., N]."""
    k = x.shape[-1]
    n = scales_zeros.shape[1]
    x2 = x.reshape(-1, k)
    if x2.dtype != torch.bfloat16:
        x2 = x2.to(torch.bfloat16)
    rows = x2.shape[0]
    if native.available():
        kernels = native.ops()
        if 0 < dequant_rows <= rows and activation_bits == 16:
            y = dequant_mm(kernels)(x2, packed, scales_zeros, group_size)
        else:
            mul = kernels.int4_gemv if rows < row_threshold else kernels.int4_gemm
            y = mul(x2, packed, scales_zeros, group_size, activation_bits)
    else:
        y = _python_linear(x2, packed, scales_zeros, group_size, row_threshold, activation_bits)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*x.shape[:-1], n).to(x.dtype)


def dequant_mm(kernels):
    """The op's branch from ``dequant_rows`` on in a kernel set: the amx and avx512bf16 sets'
    ``int4_tile_mm`` (the bf16 product on AMX tiles or AVX512_BF16 registers fed by the
    dequantization), the others' ``int4_dequant_mm``."""
    return kernels.int4_tile_mm if hasattr(kernels, "int4_tile_mm") else kernels.int4_dequant_mm


def _python_linear(x2: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                   group_size: int, row_threshold: int, activation_bits: int) -> torch.Tensor:
    """The op without native kernels: x2 bf16 [rows, K] -> bf16 [rows, N]."""
    if activation_bits not in ACTIVATION_BITS:
        raise ValueError(f"activation_bits must be 16 or 8, got {activation_bits}")
    if activation_bits == 8:
        x2 = int8_activations(x2, group_size)
    rows, k = x2.shape
    n = scales_zeros.shape[1]
    if rows < row_threshold and n % int4_pack.BLOCK_N == 0 and int4_pack.torch_reads_pack():
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), packed, group_size,
                                                          scales_zeros)
    y = None
    for r, wt in int4_pack.dequantize_t_chunks(packed, scales_zeros, k):
        if wt.shape[1] == n:  # one chunk: the whole weight
            return torch.mm(x2, wt)
        if y is None:
            y = torch.empty(rows, n, dtype=torch.bfloat16)
        y[:, r:r + wt.shape[1]] = torch.mm(x2, wt)
    return y


def cpu_int4_linear_fake(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                         group_size: int, row_threshold: int,
                         bias: Optional[torch.Tensor] = None,
                         activation_bits: int = 16, dequant_rows: int = 0) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], scales_zeros.shape[1]))


EMBEDDING_OP_NAME = "cpu_int4_embedding"


def cpu_int4_embedding(ids: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                       k: int) -> torch.Tensor:
    """Rows ``ids`` of the packed weight, dequantized: ids [...] -> bf16 [..., K].

    Also an opaque op, like the linear.
    """
    rows = int4_pack.dequantize_rows(packed, scales_zeros, ids, k)
    return rows.view(*ids.shape, k)


def cpu_int4_embedding_fake(ids: torch.Tensor, packed: torch.Tensor,
                            scales_zeros: torch.Tensor, k: int) -> torch.Tensor:
    return torch.empty((*ids.shape, k), dtype=torch.bfloat16, device=ids.device)


def registered() -> bool:
    ns = getattr(torch.ops, NAMESPACE)
    return hasattr(ns, OP_NAME) and hasattr(ns, EMBEDDING_OP_NAME)


def request_amx() -> bool:
    """Ask Linux for AMX tile state in this process (``torch._C._cpu._init_amx``).

    vLLM's CPU attention kernel (``cpu_attention_with_kv_cache``) uses AMX when the CPU has it
    but does not request the permission itself: it relies on oneDNN having done so in an
    earlier bf16 matmul. An int4 model runs no oneDNN matmul before its first attention call
    (decode uses the int4 GEMM), and the process dies with SIGILL. Requesting it is harmless
    when AMX is absent (returns False).
    """
    init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    return bool(init()) if init is not None else False


def register() -> None:
    """Register both ops with vLLM's ``direct_register_custom_op`` (once per process).

    Schemas and fake (meta) kernels come from the Python functions here. When the native
    kernel set (``csrc/int4_*.cpp``) loads, it becomes the ops' CPU kernels, so a call costs no
    Python; the Python functions are then registered under CompositeExplicitAutograd, which a
    backend kernel outranks, and serve no CPU call. Otherwise they are the CPU kernels.
    ``kernels()`` says which run.
    """
    global _KERNELS
    with _lock:
        request_amx()
        if registered():
            return
        from vllm.utils.torch_utils import direct_register_custom_op

        use_native = native.available()
        key = "CompositeExplicitAutograd" if use_native else "CPU"
        for name, fn, fake in ((OP_NAME, cpu_int4_linear, cpu_int4_linear_fake),
                               (EMBEDDING_OP_NAME, cpu_int4_embedding, cpu_int4_embedding_fake)):
            direct_register_custom_op(name, fn, mutates_args=[], fake_impl=fake, target_lib=_LIB,
                                      dispatch_key=key)
        if use_native:
            native.ops().register_kernels()
        _KERNELS = native.kernel_set()


def kernels() -> Optional[str]:
    """Which CPU kernels the ops run here: a native set ("amx", "avx512bf16", "avx512", "avx2",
    "portable"), "python",
    or None before registration."""
    return _KERNELS


def op():
    """The registered linear op (registering the ops on first use)."""
    register()
    return getattr(getattr(torch.ops, NAMESPACE), OP_NAME)


def embedding_op():
    register()
    return getattr(getattr(torch.ops, NAMESPACE), EMBEDDING_OP_NAME)
