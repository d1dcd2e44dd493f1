"""The patches' one ablation interface: what step_ab flips, by name and side, without reaching
into a patch's module state."""

import ast
from pathlib import Path

import pytest

from omni_ray.bench import step_ab
from vllm_omni import patches
from vllm_omni.patches import compiled_call, cpu_attention


def test_every_patch_switch_of_step_ab_is_an_ablation_with_the_same_sides():
    known = patches.ablations()
    patch_switches = {s for s in step_ab.SWITCHES if s in known}
    assert patch_switches == {"cpu_attention", "step_overhead", "compiled_call",
                              "attention_kernels", "attention_sync", "cache_update",
                              "compiled_entry"}
    assert all(step_ab.SWITCHES[s] == known[s] for s in patch_switches)


def test_an_unknown_switch_or_side_is_named():
    with pytest.raises(ValueError, match=r"^no ablation 'nope'; known: \['attention_kernels'"):
        patches.ablate("nope", "a")
    with pytest.raises(ValueError, match=r"^ablation attention_sync: side must be one of "
                                         r"\['per_op', 'per_forward'\], got 'sometimes'$"):
        patches.ablate("attention_sync", "sometimes")


def test_ablated_puts_the_setting_back(monkeypatch):
    monkeypatch.setattr(compiled_call, "STRAIGHT_TO_ENTRY", True)
    with patches.ablated("compiled_entry", "graph", back="entry"):
        assert compiled_call.STRAIGHT_TO_ENTRY is False
    assert compiled_call.STRAIGHT_TO_ENTRY is True


def test_cache_update_needs_the_cpp_kernels(monkeypatch):
    monkeypatch.setattr(cpu_attention, "_NATIVE", None)
    with pytest.raises(RuntimeError, match="not on its C\\+\\+ kernels"):
        patches.ablate("cache_update", "direct")


def test_the_bench_reads_no_private_state_of_vllm_omni():
    tree = ast.parse(Path(step_ab.__file__).read_text())
    private = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
               and n.attr.startswith("_") and not n.attr.startswith("__")
               and isinstance(n.value, ast.Name)
               and n.value.id in ("cpu_attention", "compiled_call", "step_overhead", "patches")]
    assert private == []
