import hashlib
import json

import pytest
from safetensors import safe_open

from omni_ray.models import build
from omni_ray.models.build import (STAMP, build_model, cached_model_dir, ensure_model,
                                   resolve_model)
from omni_ray.models.shapes import SHAPES


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensor_names(model_dir):
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_model("tiny", tmp_path_factory.mktemp("tiny") / "m")


def test_same_shape_and_seed_give_identical_bytes(tmp_path, tiny_dir):
    again = build_model("tiny", tmp_path / "again")
    assert again != tiny_dir
    assert sha256(again / "model.safetensors") == sha256(tiny_dir / "model.safetensors")
    assert sha256(again / "tokenizer.json") == sha256(tiny_dir / "tokenizer.json")


def test_another_seed_gives_other_weights(tmp_path, tiny_dir):
    other = build_model("tiny", tmp_path / "seed1", seed=1)
    assert sha256(other / "model.safetensors") != sha256(tiny_dir / "model.safetensors")
    assert tensor_names(other) == tensor_names(tiny_dir)


def test_tied_by_default_has_no_lm_head(tiny_dir):
    assert "lm_head.weight" not in tensor_names(tiny_dir)
    assert json.loads((tiny_dir / "config.json").read_text())["tie_word_embeddings"] is True


def test_untie_writes_lm_head(tmp_path, tiny_dir):
    out = build_model("tiny", tmp_path / "untied", tie_embeddings=False)
    names = tensor_names(out)
    assert names == tensor_names(tiny_dir) | {"lm_head.weight"}
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert tuple(f.get_slice("lm_head.weight").get_shape()) == (2048, 256)
        n = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    assert n == SHAPES["tiny"].num_parameters(tie_embeddings=False)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_weights_count_matches_the_shape(tiny_dir):
    with safe_open(str(tiny_dir / "model.safetensors"), "pt") as f:
        n = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}
    assert n == SHAPES["tiny"].num_parameters()


def test_stamp(tiny_dir):
    stamp = json.loads((tiny_dir / STAMP).read_text())
    peak = stamp.pop("peak_rss")
    assert stamp == {
        "builder": "omni-ray make-model", "builder_version": build.BUILDER_VERSION,
        "shape": "tiny", "seed": 0, "tie_embeddings": True,
        "num_parameters": SHAPES["tiny"].num_parameters(),
        "weights_sha256": {"model.safetensors": sha256(tiny_dir / "model.safetensors")},
        "weight_bytes": SHAPES["tiny"].num_parameters() * 2,
    }
    assert peak["unit"] == "bytes"
    for step in ("weights", "tokenizer"):
        assert peak[step]["peak_rss_bytes"] >= peak[step]["start_rss_bytes"] > 0


def test_up_to_date_dir_is_not_rebuilt(tmp_path):
    out = build_model("tiny", tmp_path / "m")
    before = {f.name: f.stat().st_mtime_ns for f in out.iterdir()}
    assert build_model("tiny", out) == out
    assert {f.name: f.stat().st_mtime_ns for f in out.iterdir()} == before


def test_other_build_in_the_dir_is_replaced(tmp_path):
    out = build_model("tiny", tmp_path / "m")
    build_model("tiny", out, seed=3)
    assert json.loads((out / STAMP).read_text())["seed"] == 3


def test_force_rebuilds(tmp_path):
    out = build_model("tiny", tmp_path / "m")
    (out / "model.safetensors").write_bytes(b"garbage")  # the stamp alone would say "up to date"
    build_model("tiny", out, force=True)
    assert sha256(out / "model.safetensors") == json.loads((out / STAMP).read_text())[
        "weights_sha256"]["model.safetensors"]


def test_stamped_dir_missing_its_weights_is_rebuilt(tmp_path):
    out = build_model("tiny", tmp_path / "m")
    (out / "model.safetensors").unlink()
    build_model("tiny", out)
    assert (out / "model.safetensors").is_file()


def test_no_temporary_dirs_left_behind(tmp_path):
    build_model("tiny", tmp_path / "m")
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_ensure_model_caches_under_omni_ray_cache(model_cache):
    out = ensure_model("tiny")
    assert out == model_cache / "models" / "tiny-seed0-tied-v2"
    assert out == cached_model_dir("tiny") and (out / "model.safetensors").is_file()
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert ensure_model("tiny") == out
    assert resolve_model("tiny") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_cache_keys():
    assert cached_model_dir("tiny", seed=2, tie_embeddings=False).name == "tiny-seed2-untied-v2"
    assert cached_model_dir("qwen2.5-0.5b").name == "qwen2.5-0.5b-seed0-tied-v2"


def test_lock_file_named_after_the_key(model_cache):
    ensure_model("tiny", seed=5)
    assert sorted(p.name for p in (model_cache / "models").iterdir()) == [
        "tiny-seed5-tied-v2", "tiny-seed5-tied-v2.lock"]


def test_lock_path_keeps_dotted_shape_names(monkeypatch, model_cache):
    """A shape name with dots ("qwen2.5-0.5b") must not truncate the lock name."""
    locked = []
    monkeypatch.setattr(build, "_lock", lambda p: (locked.append(p), _null())[1])
    monkeypatch.setattr(build, "build_model", lambda *a, **k: None)
    ensure_model("qwen2.5-0.5b")
    assert locked == [model_cache / "models" / "qwen2.5-0.5b-seed0-tied-v2.lock"]


def _null():
    import contextlib

    return contextlib.nullcontext()
