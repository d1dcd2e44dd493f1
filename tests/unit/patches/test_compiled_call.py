"""The compiled_call patch's learning and replay, on a stand-in for Dynamo's code of a forward
(real engines: tests/integration/test_patches.py, which checks the tokens and the log line)."""

from __future__ import annotations

import gc
import types
import weakref

import pytest
import torch

from vllm_omni.patches import compiled_call, is_marked

# Dynamo's code for a forward, in the shape it has for vLLM's models: read the inputs through
# the modules' dictionaries, call the graph once, return one of its outputs.
PLAIN = """
def forward(self, input_ids, positions, extra):
    return __compiled_fn_7(__import_torch_dot__dynamo_dot_utils.call_size(input_ids, 0),
                           input_ids, self._parameters["w"], self._modules["m"]._buffers["b"],
                           positions)[1]
"""


class Module:
    def __init__(self) -> None:
        self._parameters = {"w": torch.tensor(2.0)}
        self._modules = {"m": types.SimpleNamespace(_buffers={"b": torch.tensor(0.5)})}


class Compiled:
    """What AOTCompiledFunction.__call__ reads of its instance."""

    def __init__(self, source: str = PLAIN, guards: bool = False, guard_ok: bool = True):
        self.python_calls = 0  # runs of the forward's own code (vLLM's path)
        self.graph_inputs: list[tuple] = []

        def call_size(t, d):
            self.python_calls += 1
            return t.size(d)

        def graph(n, ids, w, b, pos):
            self.graph_inputs.append((n, ids, w, b, pos))
            return [torch.tensor(n), ids * w + b + pos]

        space = {"__compiled_fn_7": graph,
                 "__import_torch_dot__dynamo_dot_utils": types.SimpleNamespace(
                     call_size=call_size)}
        exec(source, space)
        self.fn = space["forward"]
        self._guard_check_enabled = guards
        self.guard_checks = 0
        self._guard_ok = guard_ok
        self._artifacts = types.SimpleNamespace(guard_manager=types.SimpleNamespace(
            check_verbose=lambda f_locals: "x changed"))

    def guard_check(self, *args, **kwargs) -> bool:
        self.guard_checks += 1
        return self._guard_ok

    def prepare_f_locals(self, *args, **kwargs) -> dict:
        return {}


@pytest.fixture
def call():
    """AOTCompiledFunction.__call__ with the patch applied, removed afterwards."""
    from torch._dynamo.aot_compile import AOTCompiledFunction

    was_applied = is_marked(AOTCompiledFunction.__call__, compiled_call.NAME)  # by doctor
    compiled_call.apply(compiled_call.find_target())
    yield AOTCompiledFunction.__call__
    compiled_call.remove()
    assert not is_marked(AOTCompiledFunction.__call__, compiled_call.NAME)
    if was_applied:
        compiled_call.apply(compiled_call.find_target())


def state(compiled) -> compiled_call._State:
    return getattr(compiled, compiled_call.STATE_ATTR)


def inputs(n: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(start, start + n, dtype=torch.float32), torch.arange(n) * 10.0


def expected(ids, pos):
    return ids * 2.0 + 0.5 + pos


def learn(call, compiled, module) -> None:
    """Three forwards of two shapes: a prompt, then two one-token steps."""
    for n in (5, 1, 1):
        call(compiled, module, *inputs(n), None)
    assert state(compiled).plan is not None


def test_replays_after_learning_with_the_arguments_of_each_call(call):
    compiled, module = Compiled(), Module()
    learn(call, compiled, module)
    assert compiled.python_calls == 3
    ids, pos = inputs(4, start=7)
    out = call(compiled, module, ids, pos, None)
    assert compiled.python_calls == 3  # the forward's Python did not run
    assert torch.equal(out, expected(ids, pos))
    n, got_ids, w, b, got_pos = compiled.graph_inputs[-1]
    assert n == 4 and got_ids is ids and got_pos is pos
    assert w is module._parameters["w"] and b is module._modules["m"]._buffers["b"]
    # a stand-in graph, not inductor's: replayed through the graph object Dynamo's code calls
    assert compiled_call.replays() == [{"function": "forward", "path": "graph"}]


def test_learning_waits_for_two_input_shapes(call):
    """Three one-token steps could be a constant size: no plan until a second shape is seen."""
    compiled, module = Compiled(), Module()
    for _ in range(3):
        call(compiled, module, *inputs(1), None)
    assert state(compiled).plan is None
    call(compiled, module, *inputs(6), None)
    assert state(compiled).plan is not None
    ids, pos = inputs(3)
    assert torch.equal(call(compiled, module, ids, pos, None), expected(ids, pos))
    assert compiled.graph_inputs[-1][0] == 3


def test_remove_forgets_the_plans_and_the_state_goes_with_its_function(call):
    compiled, module = Compiled(), Module()
    learn(call, compiled, module)
    compiled_call.remove()
    compiled_call.apply(compiled_call.find_target())
    call(compiled, module, *inputs(2), None)
    assert compiled.python_calls == 4  # learning again
    gone = weakref.ref(compiled)
    del compiled
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("how", ["tensor_for_none", "keyword", "other_module"])
def test_calls_unlike_the_recorded_ones_take_vllms_path(call, how):
    compiled, module = Compiled(), Module()
    learn(call, compiled, module)
    ids, pos = inputs(2)
    args, kwargs = (module, ids, pos, None), {}
    if how == "tensor_for_none":
        args = (module, ids, pos, torch.zeros(1))
    elif how == "keyword":
        args, kwargs = (module, ids, pos), {"extra": None}
    else:
        args = (Module(), ids, pos, None)
    out = call(compiled, *args, **kwargs)
    assert compiled.python_calls == 4
    assert torch.equal(out, expected(ids, pos))


def test_a_forward_with_side_effects_is_never_replayed(call, caplog):
    source = PLAIN.replace("    return", "    self.steps = 1\n    return")
    compiled, module = Compiled(source), Module()
    for n in (5, 1, 1, 1):
        call(compiled, module, *inputs(n), None)
    assert compiled.python_calls == 4
    assert state(compiled).refused == "its code does STORE_ATTR"
    assert compiled_call.replays() == [{"function": "forward", "path": "refused",
                                        "reason": "its code does STORE_ATTR"}]
    assert "compiled_call keeps vLLM's path for forward: its code does STORE_ATTR" in caplog.text


def test_a_forward_that_calls_anything_but_the_graph_is_never_replayed(call):
    source = PLAIN.replace("self._parameters[\"w\"]", "self._parameters.get(\"w\")")
    compiled, module = Compiled(source), Module()
    call(compiled, module, *inputs(5), None)
    assert state(compiled).refused == (
        "its code calls more than the graph and Dynamo's helpers")


def test_an_input_that_follows_no_argument_is_refused(call):
    compiled, module = Compiled(), Module()
    for n in (5, 1, 1):
        module._modules["m"]._buffers["b"] = torch.tensor(0.5)  # a new object every forward
        call(compiled, module, *inputs(n), None)
    learned = state(compiled)
    assert learned.plan is None and learned.refused == "graph input 3 (Tensor) follows no argument"


def test_guards_run_when_vllm_keeps_them_on(call):
    compiled, module = Compiled(guards=True), Module()
    learn(call, compiled, module)
    checks = compiled.guard_checks
    call(compiled, module, *inputs(2), None)
    assert compiled.guard_checks == checks + 1 and compiled.python_calls == 3
    compiled._guard_ok = False  # a failed guard: vLLM's path, which raises with the reason
    with pytest.raises(RuntimeError, match="GuardManager check failed, reason: x changed"):
        call(compiled, module, *inputs(2), None)


def test_refuses_a_torch_whose_call_changed(monkeypatch):
    name = next(iter(compiled_call.REPLICATED))
    monkeypatch.setitem(compiled_call.REPLICATED, name, "0" * 16)
    with pytest.raises(LookupError, match=f"torch changed code this patch reproduces: {name} "
                       r"\(python -m vllm_omni.patches.upstream check shows the diffs\)$"):
        compiled_call.find_target()
