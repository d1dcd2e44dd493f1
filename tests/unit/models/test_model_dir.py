"""check_model_dir / resolve_model: a bad model argument is one UserError naming what and where."""

import json
import re
import shutil

import pytest

from omni_ray.errors import UserError
from omni_ray.models.build import build_model, check_model_dir, resolve_model
from omni_ray.models.shapes import SHAPES


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_model("tiny", tmp_path_factory.mktemp("tiny") / "m")


def one_line(exc_info):
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


def test_good_dir(tiny_dir):
    assert check_model_dir(tiny_dir) == tiny_dir
    assert resolve_model(str(tiny_dir)) == tiny_dir


def test_missing_dir(tmp_path):
    with pytest.raises(UserError, match=r"^model: .*/missing: no such directory$") as e:
        check_model_dir(tmp_path / "missing")
    one_line(e)
    with pytest.raises(UserError, match=r"no such directory"):
        resolve_model(str(tmp_path / "missing"))


def test_file_instead_of_dir(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=r"/f: no such directory"):
        check_model_dir(tmp_path / "f")


def test_unknown_bare_name_lists_the_shapes():
    known = re.escape(", ".join(SHAPES))
    assert "llama-3.1-8b-full-vocab" in SHAPES
    with pytest.raises(UserError, match=r"^model: nope: neither a directory nor a shape "
                                        rf"\(known shapes: {known}\)$"):
        resolve_model("nope")


def test_what_names_the_argument(tmp_path):
    with pytest.raises(UserError, match=r"^draft model: "):
        check_model_dir(tmp_path / "missing", what="draft model")


def test_no_config_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match=r"not a Hugging Face model directory \(no config\.json\)"):
        check_model_dir(tmp_path)


def test_malformed_config_json(tmp_path, tiny_dir):
    d = tmp_path / "m"
    shutil.copytree(tiny_dir, d)
    (d / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(UserError, match=r"/m/config\.json: malformed JSON: .*line 1") as e:
        check_model_dir(d)
    one_line(e)
    with pytest.raises(UserError, match=r"config\.json: malformed JSON"):
        resolve_model(str(d))


def test_config_json_not_an_object(tmp_path, tiny_dir):
    d = tmp_path / "m"
    shutil.copytree(tiny_dir, d)
    (d / "config.json").write_text(json.dumps(["llama"]))
    with pytest.raises(UserError, match=r"config\.json: not a model config .*got a list"):
        check_model_dir(d)


def test_config_json_not_utf8(tmp_path, tiny_dir):
    d = tmp_path / "m"
    shutil.copytree(tiny_dir, d)
    (d / "config.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(UserError, match=r"config\.json: malformed JSON"):
        check_model_dir(d)


def test_no_weights(tmp_path, tiny_dir):
    d = tmp_path / "m"
    shutil.copytree(tiny_dir, d)
    (d / "model.safetensors").unlink()
    with pytest.raises(UserError,
                       match=r"^model: .*/m: no weights \(\*\.safetensors or \*\.bin\)$"):
        check_model_dir(d)
