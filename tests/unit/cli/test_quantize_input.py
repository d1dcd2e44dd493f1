"""``omni-ray quantize SRC DST`` with a bad SRC: resolve_model's one-line errors reach the user.

Only the argument checks run here; quantizing itself is tested in tests/unit/quantization.
"""

import json
import shutil

import pytest

from omni_ray.models.build import build_model
from omni_ray.models.shapes import SHAPES


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_model("tiny", tmp_path_factory.mktemp("tiny") / "m")


# vllm_omni/quantization/convert.py checks DST with dst.exists()/iterdir()/mkdir() unguarded, so
# a DST at or under a regular file is a NotADirectoryError traceback. Strict: passes once fixed.


def test_missing_src(tmp_path, user_error):
    line = user_error("quantize", tmp_path / "missing", tmp_path / "q")
    assert line == f"omni-ray quantize: error: model: {tmp_path}/missing: no such directory"
    assert not (tmp_path / "q").exists()


def test_unknown_shape_name(tmp_path, user_error, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = user_error("quantize", "tiniest", tmp_path / "q")
    assert line == ("omni-ray quantize: error: model: tiniest: neither a directory nor a shape "
                    f"(known shapes: {', '.join(SHAPES)})")


def test_src_without_config(tmp_path, user_error):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.safetensors").write_bytes(b"")
    line = user_error("quantize", tmp_path / "src", tmp_path / "q")
    assert line.endswith(f"{tmp_path}/src: not a Hugging Face model directory (no config.json)")


def test_src_with_malformed_config(tmp_path, tiny_dir, user_error):
    shutil.copytree(tiny_dir, tmp_path / "src")
    (tmp_path / "src" / "config.json").write_text("{")
    line = user_error("quantize", tmp_path / "src", tmp_path / "q")
    assert f"{tmp_path}/src/config.json: malformed JSON: " in line


def test_src_without_weights(tmp_path, tiny_dir, user_error):
    shutil.copytree(tiny_dir, tmp_path / "src")
    (tmp_path / "src" / "model.safetensors").unlink()
    line = user_error("quantize", tmp_path / "src", tmp_path / "q")
    assert line.endswith(f"{tmp_path}/src: no weights (*.safetensors or *.bin)")


def test_src_with_only_bin_weights(tmp_path, tiny_dir, user_error):
    shutil.copytree(tiny_dir, tmp_path / "src")
    (tmp_path / "src" / "model.safetensors").rename(tmp_path / "src" / "pytorch_model.bin")
    line = user_error("quantize", tmp_path / "src", tmp_path / "q")
    assert "no *.safetensors weights" in line


def test_already_quantized_src(tmp_path, tiny_dir, user_error):
    shutil.copytree(tiny_dir, tmp_path / "src")
    cfg = json.loads((tmp_path / "src" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "cpu_int4"}
    (tmp_path / "src" / "config.json").write_text(json.dumps(cfg))
    line = user_error("quantize", tmp_path / "src", tmp_path / "q")
    assert line.endswith(f"{tmp_path}/src/config.json: already quantized (cpu_int4)")


def test_non_empty_dst(tmp_path, tiny_dir, user_error):
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "x").write_text("keep")
    line = user_error("quantize", tiny_dir, tmp_path / "q")
    assert f"{tmp_path}/q: exists and is not empty" in line


def test_dst_under_a_regular_file(tmp_path, tiny_dir, user_error):
    (tmp_path / "afile").write_text("x")
    line = user_error("quantize", tiny_dir, tmp_path / "afile" / "q")
    assert line.endswith(f"error: {tmp_path}/afile/q: cannot write the checkpoint there: "
                         f"{tmp_path}/afile is a file, not a directory")


def test_dst_is_a_regular_file(tmp_path, tiny_dir, user_error):
    (tmp_path / "afile").write_text("x")
    line = user_error("quantize", tiny_dir, tmp_path / "afile")
    assert line.endswith(f"error: {tmp_path}/afile: cannot write the checkpoint there: "
                         f"{tmp_path}/afile is a file, not a directory")
    assert (tmp_path / "afile").read_text() == "x"  # left as it was


def test_unwritable_model_cache(tmp_path, monkeypatch, user_error):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("OMNI_RAY_CACHE", str(tmp_path / "afile"))
    line = user_error("quantize", "tiny", tmp_path / "q")
    assert line.startswith(f"omni-ray quantize: error: {tmp_path}/afile/models: cannot write "
                           "the model cache there")
    assert line.endswith("set OMNI_RAY_CACHE to a writable directory")
