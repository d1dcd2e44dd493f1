"""Every vLLM / torch internal that a vllm_omni shim relies on still exists in the pinned vLLM."""

from __future__ import annotations

import pytest

from vllm_omni import patches

pytestmark = pytest.mark.compat


@pytest.mark.parametrize("patch", patches.PATCHES, ids=lambda p: p.NAME)
def test_patch_target_exists(patch):
    patch.find_target()  # raises LookupError naming what is gone


def test_register_applies_every_patch_and_is_idempotent():
    import vllm_omni

    vllm_omni.register()
    first = vllm_omni.patch_report()
    vllm_omni.register()
    assert vllm_omni.patch_report() == first
    assert all(s["applied"] for s in first.values()), first


def test_a_missing_target_is_reported_not_raised(monkeypatch):
    from vllm_omni.patches import kv_budget

    def gone():
        raise LookupError("CpuPlatform.check_and_update_config is not a classmethod here")

    monkeypatch.setattr(kv_budget, "find_target", gone)
    status = {s.name: s for s in patches.apply_all()}["kv_budget"]
    assert status.applied is False and "target missing" in status.reason


def test_off_switch(monkeypatch):
    monkeypatch.setenv("VLLM_OMNI_DISABLE_AOT_CACHE", "1")
    status = {s.name: s for s in patches.apply_all()}["aot_cache"]
    assert status.reason == "disabled by VLLM_OMNI_DISABLE_AOT_CACHE=1"


@pytest.mark.parametrize("name, changed", [
    ("cpu_attention", "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl.forward"),
    ("step_overhead", "vllm.v1.sample.sampler.Sampler.sample")])
def test_a_patch_refuses_a_vllm_whose_replicated_code_changed(monkeypatch, name, changed):
    """A patch that reproduces vLLM functions stops when one differs from the fingerprinted
    version, and names it."""
    patch = {p.NAME: p for p in patches.PATCHES}[name]
    monkeypatch.setitem(patch.REPLICATED, changed, "0" * 16)
    with pytest.raises(LookupError, match=f"vLLM changed code this patch reproduces: {changed} "
                                          r"\(python -m vllm_omni.patches.upstream check shows "
                                          r"the diffs\)$"):
        patch.find_target()


def test_cpu_attention_can_be_removed_and_applied_again():
    """step_ab flips the patch within one process."""
    from vllm_omni.patches import cpu_attention, is_marked

    patches.apply_all()
    try:
        cpu_attention.remove()
        target = cpu_attention.find_target()
        assert cpu_attention._LIB is None and not is_marked(target, cpu_attention.NAME)
        status = {s.name: s for s in patches.apply_all()}["cpu_attention"]
        assert status.applied and cpu_attention._LIB is not None
        assert is_marked(cpu_attention.find_target(), cpu_attention.NAME)
    finally:
        patches.apply_all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("kv_heads,head_size,block_size", [(2, 64, 128), (4, 128, 32), (1, 32, 64)])
def test_direct_cache_update_writes_the_bytes_vllms_kernel_writes(dtype, kv_heads, head_size,
                                                                  block_size):
    """The cpu_attention C++ kernels copy decode K/V rows into vLLM's "vec" cache layout
    themselves: the cache must hold exactly what vLLM's reshape_and_cache writes, padding slots
    (-1) skipped, for keys and values that are strided views of a fused QKV tensor."""
    import torch
    import vllm._custom_ops as ops

    from vllm_omni.ops import native

    kernels, reason = native.attention_kernels()
    if kernels is None:
        pytest.skip(f"C++ kernels unavailable: {reason}")
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(kv_heads * head_size + block_size)
    blocks, tokens = 5, 70
    qkv = torch.randn(tokens, (4 + 2) * kv_heads, head_size, generator=gen).to(dt)
    key, value = qkv[:, 4 * kv_heads:5 * kv_heads], qkv[:, 5 * kv_heads:]
    slots = torch.randperm(blocks * block_size, generator=gen)[:tokens + 3]
    slots[[3, 17]] = -1
    caches = []
    for _ in range(2):
        kv = torch.randn(blocks, kv_heads, block_size, 2 * head_size, generator=gen).to(dt)
        caches.append((kv, *kv.view(blocks, kv_heads, 2 * block_size, head_size).chunk(2, dim=2)))
    caches[1][0].copy_(caches[0][0])
    ops.cpu_attn_reshape_and_cache(key, value, caches[0][1], caches[0][2], slots, "vec")
    assert kernels.direct_update(key, value, caches[1][1], caches[1][2], slots)
    assert torch.equal(caches[0][0], caches[1][0])
    # what it does not serve it leaves alone: a slot mapping of int32, a quantized dtype
    assert not kernels.direct_update(key, value, caches[1][1], caches[1][2], slots.int())
    assert not kernels.direct_update(key.half(), value.half(), caches[1][1], caches[1][2], slots)


def test_cpu_attention_refuses_when_a_replicated_function_is_gone(monkeypatch):
    from vllm_omni.patches import cpu_attention

    gone = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl.no_such_method"
    monkeypatch.setitem(cpu_attention.REPLICATED, gone, "0" * 16)
    with pytest.raises(LookupError, match=f"cannot read {gone}"):
        cpu_attention.find_target()


def test_inductor_settings_passed_survive_what_stock_vllm_overwrites(monkeypatch, tiny_model):
    """vLLM's CPU platform replaces cpp.dynamic_threads in inductor_compile_config; with the
    inductor_config patch the value passed stays, and with vLLM's own function it does not."""
    import inspect

    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms.cpu import CpuPlatform

    patches.apply_all()

    def dynamic_threads() -> object:
        args = EngineArgs(model=str(tiny_model), enforce_eager=False, max_model_len=256,
                          kv_cache_memory_bytes=64 << 20, compilation_config={
                              "inductor_compile_config": {"cpp.dynamic_threads": False}})
        return args.create_engine_config().compilation_config.inductor_compile_config[
            "cpp.dynamic_threads"]

    assert dynamic_threads() is False
    stock = inspect.unwrap(CpuPlatform.check_and_update_config.__func__)
    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(stock))
    assert dynamic_threads() is True


def test_step_overhead_can_be_removed_and_applied_again():
    """step_ab flips the patch within one process: removed, each method is vLLM's own."""
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker.block_table import BlockTable

    from vllm_omni.patches import is_marked, step_overhead

    patches.apply_all()
    methods = ((CpuGpuBuffer, "copy_to_gpu"), (BlockTable, "compute_slot_mapping"),
               (Sampler, "forward"))
    try:
        assert all(hasattr(getattr(c, m), "__wrapped__") for c, m in methods)
        step_overhead.remove()
        assert not any(hasattr(getattr(c, m), "__wrapped__") for c, m in methods)
        assert not is_marked(step_overhead.find_target(), step_overhead.NAME)
        step_overhead.apply(step_overhead.find_target())
        step_overhead.apply(step_overhead.find_target())  # twice: still one layer over vLLM's
        assert all(not hasattr(getattr(c, m).__wrapped__, "__wrapped__") for c, m in methods)
    finally:
        step_overhead.remove()
        patches.apply_all()


def test_a_self_aliased_buffer_is_not_copied_onto_itself():
    """The CPU runner's buffers have gpu = cpu: no copy runs. Any other buffer still copies."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from vllm.v1.utils import CpuGpuBuffer

    class Copies(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Copies.n += func is torch.ops.aten.copy_.default
            return func(*args, **(kwargs or {}))

    patches.apply_all()
    buf = CpuGpuBuffer(4, dtype=torch.int32, device=torch.device("cpu"), pin_memory=False)
    buf.np[:] = [1, 2, 3, 4]
    with Copies():
        assert buf.copy_to_gpu(2).tolist() == [1, 2]
    assert Copies.n == 1 and buf.gpu.tolist() == [1, 2, 0, 0]
    buf.gpu = buf.cpu
    with Copies():
        out = buf.copy_to_gpu(3)
    assert Copies.n == 1  # none more
    assert out.data_ptr() == buf.cpu.data_ptr() and out.tolist() == [1, 2, 3]


def test_greedy_only_batches_are_those_the_sampler_reduces_to_an_argmax():
    from types import SimpleNamespace

    from vllm.v1.sample.logits_processor.builtin import (LogitBiasLogitsProcessor,
                                                         MinTokensLogitsProcessor)

    from vllm_omni.patches.step_overhead import greedy_only

    min_toks = object.__new__(MinTokensLogitsProcessor)
    min_toks.min_toks = {}
    bias = object.__new__(LogitBiasLogitsProcessor)
    bias.biases = {}

    def meta(**kw):
        base = dict(all_greedy=True, max_num_logprobs=None, logprob_token_ids=None,
                    allowed_token_ids_mask=None, bad_words_token_ids={}, no_penalties=True,
                    thinking_budget_state_holder=None,
                    logitsprocs=SimpleNamespace(non_argmax_invariant=[min_toks, bias]))
        return SimpleNamespace(**{**base, **kw})

    assert greedy_only(meta())
    for change in (dict(all_greedy=False), dict(max_num_logprobs=0),
                   dict(logprob_token_ids={0: [1]}), dict(allowed_token_ids_mask=object()),
                   dict(bad_words_token_ids={0: [[1]]}), dict(no_penalties=False),
                   dict(thinking_budget_state_holder=SimpleNamespace(
                       has_tracked_requests=lambda: True)),
                   dict(logitsprocs=SimpleNamespace(non_argmax_invariant=[object()]))):
        assert not greedy_only(meta(**change)), change
    min_toks.min_toks = {0: (4, [], {2}, False)}
    assert not greedy_only(meta())
