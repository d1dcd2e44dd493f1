"""``omni-ray make-model``: builds, and bad input as one line with exit 2."""

import json

import pytest

from omni_ray import cli
from omni_ray.models.build import STAMP


def test_builds_and_reports(tmp_path, capsys):
    assert cli.main(["make-model", "--shape", "tiny", "--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert out == f"{tmp_path / 'm'}: tiny, 1.7M parameters, seed 0, tied embeddings\n"
    assert json.loads((tmp_path / "m" / STAMP).read_text())["shape"] == "tiny"


def test_untie_and_seed(tmp_path, capsys):
    argv = ["make-model", "--shape", "tiny", "--out", str(tmp_path / "m"), "--untie",
            "--seed", "7"]
    assert cli.main(argv) == 0
    assert "seed 7, untied embeddings" in capsys.readouterr().out
    stamp = json.loads((tmp_path / "m" / STAMP).read_text())
    assert (stamp["seed"], stamp["tie_embeddings"]) == (7, False)
    assert json.loads((tmp_path / "m" / "config.json").read_text())["tie_word_embeddings"] is False


def test_tie_flags_are_exclusive(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["make-model", "--shape", "tiny", "--out", str(tmp_path), "--untie",
                  "--tie-embeddings"])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_unknown_shape_names_the_known_ones(tmp_path, user_error):
    line = user_error("make-model", "--shape", "nope", "--out", tmp_path / "m")
    assert line == ("omni-ray make-model: error: unknown shape 'nope'; "
                    "known shapes: tiny, small, qwen2.5-0.5b, qwen2.5-0.5b-full-vocab, "
                    "qwen2.5-1.5b, qwen2.5-1.5b-full-vocab, qwen2.5-3b, qwen2.5-3b-full-vocab, "
                    "qwen2.5-7b, qwen2.5-7b-full-vocab, llama-3.1-8b, llama-3.1-8b-full-vocab")
    assert not (tmp_path / "m").exists()


def test_out_under_a_regular_file(tmp_path, user_error):
    (tmp_path / "afile").write_text("x")
    line = user_error("make-model", "--shape", "tiny", "--out", tmp_path / "afile" / "sub" / "m")
    assert line == (f"omni-ray make-model: error: {tmp_path}/afile/sub/m: cannot write the model "
                    f"there: {tmp_path}/afile is not a directory")


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_out_is_a_regular_file(tmp_path, user_error, force):
    (tmp_path / "afile").write_text("keep me")
    line = user_error("make-model", "--shape", "tiny", "--out", tmp_path / "afile", *force)
    assert line.endswith(f"{tmp_path}/afile: cannot write the model there: "
                         f"{tmp_path}/afile is not a directory")
    assert (tmp_path / "afile").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]  # no temporary dir left


def test_out_where_no_directory_can_be_made(user_error):
    line = user_error("make-model", "--shape", "tiny", "--out", "/proc/omni-ray-test/m")
    assert line.startswith("omni-ray make-model: error: /proc/omni-ray-test/m: "
                           "cannot write the model there: ")


def test_non_empty_dir_not_made_by_make_model(tmp_path, user_error):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    line = user_error("make-model", "--shape", "tiny", "--out", tmp_path / "mine")
    assert line == (f"omni-ray make-model: error: {tmp_path}/mine: exists and is not a model "
                    "made by make-model; choose an empty directory or pass --force")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_force_replaces_a_foreign_dir(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("gone")
    assert cli.main(["make-model", "--shape", "tiny", "--out", str(tmp_path / "mine"),
                     "--force"]) == 0
    assert not (tmp_path / "mine" / "notes.txt").exists()
    assert (tmp_path / "mine" / STAMP).is_file()


def test_empty_dir_is_used(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["make-model", "--shape", "tiny", "--out", str(tmp_path / "empty")]) == 0
    assert (tmp_path / "empty" / "model.safetensors").is_file()
