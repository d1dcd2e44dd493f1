import json
import os

import pytest

from omni_ray.errors import UserError
from omni_ray.results.store import read_json, write_json_atomic, write_text_atomic


def test_round_trip_creates_directories(tmp_path):
    path = tmp_path / "a" / "b" / "r.json"
    obj = {"x": 1, "nested": {"y": [1, 2.5, None]}, "text": "µs"}
    assert write_json_atomic(path, obj) == path
    assert read_json(path) == obj
    assert path.read_text(encoding="utf-8").endswith("\n")


def test_replace_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"v": 1})
    write_json_atomic(path, {"v": 2})
    assert read_json(path) == {"v": 2}
    assert os.listdir(tmp_path) == ["r.json"]


def test_unserialisable_value_leaves_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(ValueError, match="r.json: cannot write as JSON"):
        write_json_atomic(path, {"v": float("nan")})
    with pytest.raises(ValueError, match="cannot write as JSON"):
        write_json_atomic(path, {"v": object()})
    assert read_json(path) == {"v": 1}
    assert os.listdir(tmp_path) == ["r.json"]


def test_failed_write_removes_the_temporary(tmp_path, monkeypatch):
    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        write_text_atomic(tmp_path / "t.txt", "hello")
    assert os.listdir(tmp_path) == []


def test_write_text(tmp_path):
    write_text_atomic(tmp_path / "t.md", "| a |\n")
    assert (tmp_path / "t.md").read_text() == "| a |\n"


def test_corrupt_json_names_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"a": 1,\n  "b": }\n')
    with pytest.raises(UserError, match=r"bad.json: corrupt JSON at line 2 column 8"):
        read_json(path)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(UserError, match="nope.json: no such result file"):
        read_json(tmp_path / "nope.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="bin.json: not a UTF-8 text file"):
        read_json(tmp_path / "bin.json")


def test_output_is_plain_json(tmp_path):
    write_json_atomic(tmp_path / "r.json", {"b": 1, "a": 2})
    text = (tmp_path / "r.json").read_text()
    assert list(json.loads(text)) == ["b", "a"]  # insertion order kept
