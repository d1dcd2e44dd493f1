"""The cpu_attention patch's wrapper around vLLM's GPUModelRunner._model_forward: its decisions,
with a fake C++ kernel module and forward context (the real engine path is
tests/integration/test_patches.py, which checks the engine's "ops served without the GIL" line)."""

import pytest


def test_model_forward_wrapper_pushes_metadata_before_each_forward(monkeypatch):
    """The cpu_attention patch wraps GPUModelRunner._model_forward once: with the C++ kernels
    installed and a forward context set, it arms them before the forward and disarms them after,
    even when the forward raises; otherwise it only calls vLLM's method."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_omni.patches import cpu_attention

    calls = []

    def inner(self, *args, **kwargs):
        calls.append(("forward", args, kwargs))
        if kwargs.get("fail"):
            raise RuntimeError("engine died")
        return "out"

    class Kernels:
        def arm(self, ctx):
            calls.append(("arm", ctx.name))
            return ctx.serves

        def disarm(self):
            calls.append(("disarm",))

        def armed_calls(self):
            return 0

    monkeypatch.setattr(GPUModelRunner, "_model_forward", inner)
    monkeypatch.setattr(cpu_attention, "_FORWARD", None)
    monkeypatch.setattr(cpu_attention, "_NATIVE", None)
    forward_context = SimpleNamespace(_forward_context=SimpleNamespace(name="step", serves=True))
    cpu_attention._wrap_model_forward(forward_context)
    cpu_attention._wrap_model_forward(forward_context)  # a second apply does not wrap again
    wrapped = GPUModelRunner._model_forward
    assert wrapped.__wrapped__ is inner

    def forward(**kwargs):
        calls.clear()
        assert wrapped(None, 1, **kwargs) == "out"
        return [c[0] for c in calls]

    assert forward() == ["forward"]  # kernels not installed (removed, or Python kernels)
    monkeypatch.setattr(cpu_attention, "_NATIVE", Kernels())
    assert forward() == ["arm", "forward", "disarm"]
    forward_context._forward_context.serves = False  # sync refused (e.g. a KV connector)
    assert forward() == ["arm", "forward"]
    monkeypatch.setattr(cpu_attention, "PER_FORWARD_SYNC", False)
    assert forward() == ["forward"]
    monkeypatch.setattr(cpu_attention, "PER_FORWARD_SYNC", True)
    forward_context._forward_context = None
    assert forward() == ["forward"]
    forward_context._forward_context = SimpleNamespace(name="step", serves=True)
    calls.clear()
    with pytest.raises(RuntimeError, match="engine died"):
        wrapped(None, fail=True)
    assert [c[0] for c in calls] == ["arm", "forward", "disarm"]
