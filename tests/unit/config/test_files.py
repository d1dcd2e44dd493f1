"""Sweep files: every bad file under tests/configs/invalid fails naming its field; good ones load.

Each invalid file starts with ``# expect: <regex>``, matched against the one-line message.
Files whose name starts with "_" are fragments that other files include, not sweeps.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from omni_ray.config import expand, load_sweep_file, load_sweeps
from omni_ray.errors import ConfigError, UserError

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "tests" / "configs"
INVALID = sorted(p for p in (CONFIGS / "invalid").glob("*.yaml") if not p.name.startswith("_"))
VALID = sorted(p for p in (CONFIGS / "valid").glob("*.yaml") if not p.name.startswith("_"))
PROJECT_CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
FRAGMENTS = sorted((ROOT / "configs" / "_fragments").glob("*.yaml"))


def _included(path: Path) -> list[str]:
    """The fragments ``path`` includes, as paths beside it."""
    includes = yaml.safe_load(path.read_text()).get("include", [])
    return [str(path.parent / name) for name in includes]


def _expect(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: <regex>'"
    return first[len("# expect: "):]


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_file_names_the_field(path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_sweep_file(path)
    message = str(info.value)
    assert "\n" not in message
    # names the file, or the fragment it includes where the fault is
    named = message.split(": ", 1)[0]
    assert named == str(path) or named in _included(path), message
    assert re.search(_expect(path), message), f"{message!r} !~ {_expect(path)!r}"


def test_invalid_cases_are_many() -> None:
    assert len(INVALID) >= 100


def test_error_carries_its_parts() -> None:
    path = CONFIGS / "invalid" / "matrix_bad_value.yaml"
    with pytest.raises(ConfigError) as info:
        load_sweep_file(path)
    assert (info.value.source, info.value.path, info.value.value) == (
        str(path), "matrix.kv_cache_mib[2]", -1)
    assert str(info.value) == f"{path}: matrix.kv_cache_mib[2]: must be > 0, got -1"


def test_relative_path_is_named_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match=r"^tests/configs/invalid/kv_negative\.yaml: stage\."):
        load_sweep_file("tests/configs/invalid/kv_negative.yaml")


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_valid_file_loads_and_expands(path: Path) -> None:
    sweep = load_sweep_file(path)
    arms = expand(sweep)
    assert arms and [a.index for a in arms] == list(range(len(arms)))
    assert len({a.id for a in arms}) == len(arms)


@pytest.mark.parametrize("path", PROJECT_CONFIGS, ids=[p.stem for p in PROJECT_CONFIGS])
def test_project_config_loads_and_expands(path: Path) -> None:
    assert expand(load_sweep_file(path))


def test_project_configs_have_unique_names() -> None:
    if not PROJECT_CONFIGS:
        pytest.skip("no configs/*.yaml yet")
    load_sweeps(PROJECT_CONFIGS)


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=[p.stem for p in FRAGMENTS])
def test_project_fragment_completes_a_sweep(fragment: Path, tmp_path: Path) -> None:
    # A fragment is partial: give it what it may lack (a model via the tiny fragment, a name).
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(f"name: s\ninclude: [{FRAGMENTS[0].parent / 'tiny.yaml'}, {fragment}]\n")
    sweep = load_sweep_file(sweep_file)
    assert str(fragment) in sweep.include and expand(sweep)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match=r"nowhere\.yaml: cannot read file: No such file"):
        load_sweep_file(CONFIGS / "nowhere.yaml")


def test_directory_is_not_a_file() -> None:
    with pytest.raises(ConfigError, match=r"valid: cannot read file: Is a directory"):
        load_sweep_file(CONFIGS / "valid")


def test_unreadable_file(tmp_path: Path) -> None:
    # a path under a regular file cannot be opened, even by root (CI runs as root, which
    # reads a chmod 0 file)
    (tmp_path / "afile").write_text("x")
    path = tmp_path / "afile" / "sweep.yaml"
    with pytest.raises(ConfigError) as info:
        load_sweep_file(path)
    assert str(info.value) == f"{path}: cannot read file: Not a directory"


def test_include_merges_fragments_file_wins() -> None:
    sweep = load_sweep_file(CONFIGS / "valid" / "include.yaml")
    assert sweep.stage.kv_cache_mib == 128                     # file over fragment
    assert sweep.stage.max_num_seqs == 4                       # fragment
    assert dict(sweep.stage.env) == {"OMP_NUM_THREADS": "2",   # env mappings merged
                                     "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert (sweep.workload.prompt_len, sweep.workload.repeats) == (8, 2)  # nested fragment, file
    assert list(sweep.matrix) == ["batch", "max_num_seqs"]     # fragment's axis first
    assert [Path(p).name for p in sweep.include] == ["_workload.yaml", "_base.yaml"]
    assert len(expand(sweep)) == 4


def test_include_relative_model_resolves_in_the_fragment_dir(tmp_path: Path) -> None:
    (tmp_path / "frags" / "models" / "m1").mkdir(parents=True)
    (tmp_path / "frags" / "m.yaml").write_text("model: models/m1\nstage: {kv_cache_mib: 8}\n")
    (tmp_path / "s.yaml").write_text("name: s\ninclude: [frags/m.yaml]\n")
    sweep = load_sweep_file(tmp_path / "s.yaml")
    assert sweep.stage.model == str(tmp_path / "frags" / "models" / "m1")


def test_included_twice_without_a_cycle_is_fine(tmp_path: Path) -> None:
    (tmp_path / "_a.yaml").write_text("stage: {kv_cache_mib: 8}\n")
    (tmp_path / "_b.yaml").write_text("include: [_a.yaml]\n")
    (tmp_path / "s.yaml").write_text("name: s\nmodel: tiny\ninclude: [_a.yaml, _b.yaml]\n")
    assert load_sweep_file(tmp_path / "s.yaml").stage.kv_cache_mib == 8


def test_load_sweeps_rejects_duplicate_names(tmp_path: Path) -> None:
    other = tmp_path / "again.yaml"
    other.write_text((CONFIGS / "valid" / "minimal.yaml").read_text())
    with pytest.raises(ConfigError, match=r"again\.yaml: name: sweep name already used by .*"
                                          r"minimal\.yaml, got 'minimal'"):
        load_sweeps([CONFIGS / "valid" / "minimal.yaml", other])


def test_load_sweeps_keeps_order() -> None:
    names = [s.name for s in load_sweeps([CONFIGS / "valid" / "zip.yaml",
                                          CONFIGS / "valid" / "minimal.yaml"])]
    assert names == ["prompt-shapes", "minimal"]


def test_load_sweeps_needs_a_file() -> None:
    with pytest.raises(UserError, match="no sweep files"):
        load_sweeps([])
