import json
import os
import subprocess
import sys
import time
from pathlib import Path

from omni_ray.results import provenance
from omni_ray.results.provenance import (REDACTED, collect, cpu_model, git_state, package_versions,
                                         recorded_env)


def test_collect_has_the_provenance_fields(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    monkeypatch.setenv("HOME_NOT_RECORDED", "x")
    p = collect(cpu=False)
    for key in ("time", "host", "python", "cpu_count", "affinity", "git", "packages", "env",
                "loadavg", "pid", "platform"):
        assert key in p, key
    assert p["time"].endswith("+00:00")
    assert p["affinity"] == sorted(os.sched_getaffinity(0))
    assert p["python"]["version"].startswith("3.")
    assert p["env"]["OMP_NUM_THREADS"] == "2" and p["env"]["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "HOME_NOT_RECORDED" not in p["env"]
    assert "cpu" not in p
    json.dumps(p, allow_nan=False)


def test_env_selection_and_secret_redaction():
    env = {"OMP_NUM_THREADS": "4", "KMP_AFFINITY": "compact", "MKL_DEBUG": "1",
           "LD_PRELOAD": "/usr/lib/libtcmalloc.so", "VLLM_API_KEY": "sk-123",
           "VLLM_HF_TOKEN_X": "t", "PATH": "/bin", "LD_LIBRARY_PATH": "/x"}
    assert recorded_env(env) == {"KMP_AFFINITY": "compact", "LD_PRELOAD": "/usr/lib/libtcmalloc.so",
                                 "MKL_DEBUG": "1", "OMP_NUM_THREADS": "4",
                                 "VLLM_API_KEY": REDACTED, "VLLM_HF_TOKEN_X": REDACTED}


def test_package_versions_from_metadata():
    v = package_versions()
    assert set(v) == {"omni-ray", "vllm-cpu", "torch", "ray", "transformers", "psutil"}
    assert v["omni-ray"]
    assert package_versions(("no-such-dist-omni",)) == {"no-such-dist-omni": None}


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_git_state_of_a_checkout_and_its_dirty_flag(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "untracked.txt").write_text("not counted\n")
    assert git_state(tmp_path) == {"sha": sha, "dirty": False, "repo": str(tmp_path)}
    (tmp_path / "a.txt").write_text("two\n")
    assert git_state(tmp_path) == {"sha": sha, "dirty": True, "repo": str(tmp_path)}


def test_git_state_of_this_checkout():
    # the suite runs from a clone (CI clones the repository): the record names its HEAD
    root = Path(provenance.__file__).resolve().parents[2]
    assert git_state()["sha"] == _git(root, "rev-parse", "HEAD")


def test_git_state_outside_a_checkout(tmp_path):
    assert git_state(tmp_path) == {"sha": None, "dirty": None, "repo": None}


def test_git_state_in_a_subdirectory_of_another_repo_is_not_ours(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    inner = tmp_path / "site-packages"
    inner.mkdir()
    assert git_state(inner)["sha"] is None


def test_git_state_dirty_flag(tmp_path):
    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t",
                        *a], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f").write_text("1")
    git("add", "f")
    git("commit", "-q", "-m", "x")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "f").write_text("2")
    assert git_state(tmp_path)["dirty"] is True


def test_cpu_model_is_computed_once(monkeypatch):
    cpu_model.cache_clear()
    calls = []
    import cpuinfo

    def fake():
        calls.append(1)
        return {"brand_raw": "Fake CPU", "arch": "X86_64", "flags": ["avx512f", "amx_tile"],
                "hz_actual": [1, 0]}

    monkeypatch.setattr(cpuinfo, "get_cpu_info", fake)
    try:
        first = collect()["cpu"]
        first["flags"].append("mutated by caller")
        second = collect()["cpu"]
        assert calls == [1]
        assert second["brand"] == "Fake CPU" and second["flags"] == ["amx_tile", "avx512f"]
        assert "hz_actual" not in second  # changes between calls: not provenance
    finally:
        cpu_model.cache_clear()


def test_cpu_model_falls_back_when_cpuinfo_fails(monkeypatch):
    cpu_model.cache_clear()
    import cpuinfo

    def broken():
        raise RuntimeError("no cpuid")

    monkeypatch.setattr(cpuinfo, "get_cpu_info", broken)
    try:
        c = cpu_model()
        assert "py-cpuinfo failed" in c["error"] and c["flags"] == []
    finally:
        cpu_model.cache_clear()


def test_repeated_collect_is_cheap():
    collect(cpu=False)
    t = time.perf_counter()
    for _ in range(5):
        collect(cpu=False)
    assert (time.perf_counter() - t) / 5 < 0.5


def test_results_layer_imports_neither_ray_nor_vllm():
    heavy = ("ray", "vllm", "torch", "transformers", "vllm_omni")
    code = ("import sys\n"
            "from omni_ray.results import provenance, record, store, summary\n"
            "provenance.collect(cpu=False)\n"
            "record.make_record(kind='k', config={}, measurements={}, status='ok', provenance={})\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_static_part_is_cached():
    assert provenance._static() is provenance._static()
