"""The arm's VLLM_CACHE_ROOT shares vLLM's model-class facts, learnt before any measuring."""

import json
import shutil
import subprocess

import pytest

from omni_ray.engines import vllm_modelinfo as mi

ENTRY = "vllm-model_executor-models-llama-LlamaForCausalLM.json"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_RAY_CACHE", str(tmp_path / "omni"))
    return tmp_path


def _model(tmp_path, arches):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": arches}))
    return d


def test_share_links_every_arms_cache_to_one_copy(cache):
    for arm in ("a", "b"):
        mi.share(cache / arm / "vllm-cache")
        link = cache / arm / "vllm-cache" / mi.MODELINFOS
        assert link.is_symlink() and link.resolve() == mi.shared_dir().resolve()
    (cache / "a" / "vllm-cache" / mi.MODELINFOS / "x.json").write_text("{}")
    assert (cache / "b" / "vllm-cache" / mi.MODELINFOS / "x.json").exists()
    mi.share(cache / "a" / "vllm-cache")  # again: unchanged
    shutil.rmtree(cache / "a" / "vllm-cache")  # what launch_arm does after the arm
    assert (mi.shared_dir() / "x.json").exists()
    own = cache / "c" / "vllm-cache" / mi.MODELINFOS  # an arm's own copy is left alone
    own.mkdir(parents=True)
    mi.share(own.parent)
    assert own.is_dir() and not own.is_symlink()


def test_missing_names_the_classes_without_an_entry(cache):
    model = _model(cache, ["LlamaForCausalLM", "Qwen2ForCausalLM"])
    assert mi.missing(model) == ["LlamaForCausalLM", "Qwen2ForCausalLM"]
    mi.shared_dir().mkdir(parents=True)
    (mi.shared_dir() / ENTRY).write_text("{}")
    assert mi.missing(model) == ["Qwen2ForCausalLM"]
    assert mi.architectures(cache / "nowhere") == []


def test_warm_learns_only_what_is_missing_in_a_process_of_its_own(cache, monkeypatch):
    model = _model(cache, ["LlamaForCausalLM"])
    calls = []

    def fake_run(cmd, **kw):
        calls.append((cmd, kw["env"]["VLLM_CACHE_ROOT"]))
        (mi.shared_dir() / ENTRY).write_text("{}")  # what vLLM's inspection saves
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(mi.subprocess, "run", fake_run)
    assert mi.warm(None, str(model)) == "off" and not calls
    root = str(cache / "arm" / "vllm-cache")
    assert mi.warm(root, str(model)) == "learnt"
    assert calls[0][0][-2:] == [mi.__name__, str(model)] and calls[0][1] == root
    assert (cache / "arm" / "vllm-cache" / mi.MODELINFOS / ENTRY).exists()  # through the link
    assert mi.warm(str(cache / "arm2"), str(model)) == "cached" and len(calls) == 1


def test_a_class_vllm_does_not_cache_is_asked_once(cache, monkeypatch):
    model = _model(cache, ["PluginForCausalLM"])
    calls = []
    monkeypatch.setattr(mi.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0, "", ""))
    assert mi.warm(str(cache / "arm"), str(model)) == "not cached by vLLM: PluginForCausalLM"
    assert mi.warm(str(cache / "arm2"), str(model)) == "cached" and len(calls) == 1


def test_warm_never_raises(cache, monkeypatch):
    model = _model(cache, ["LlamaForCausalLM"])
    monkeypatch.setattr(mi.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "Traceback ...\nImportError: no vllm"))
    assert mi.warm(str(cache / "arm"), str(model)) == "not learnt: exit 1: ImportError: no vllm"

    def hang(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(mi.subprocess, "run", hang)
    assert mi.warm(str(cache / "arm"), str(model)) == "not learnt: TimeoutExpired"
