"""A stage env's loader variables reach the engine process itself: LD_PRELOAD set after the
interpreter started would reach only its children, so the runner starts itself again with it
(same pid) and records what the loader mapped. Real processes, a library no runner loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_ray.config import StageConfig
from omni_ray.engine.runner import preloaded, with_prefix
from omni_ray.engines.request import EngineRequest

ROOT = Path(__file__).resolve().parents[3]
LIBDIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
CANDIDATES = ("libtcmalloc_minimal.so.4", "libbz2.so.1.0", "libz.so.1", "libexpat.so.1")

# serves a run_fn that reports its pid and what the loader mapped for LD_PRELOAD
SCRIPT = """
import os, sys
from omni_ray.engine import runner
if os.environ.get("NO_EXEC"):
    runner.exec_for_loader = lambda env, argv: None  # what the runner did before
runner.serve(lambda req: {"status": "ok", "pid": os.getpid(),
                          "preloaded": runner.preloaded(os.environ.get("LD_PRELOAD", ""))})
"""


def _serve(tmp_path: Path, env: dict, as_module: bool, no_exec: bool = False) -> dict:
    req = EngineRequest(stage=StageConfig(model="tiny", engine="transformers", env=env))
    req_path, out = tmp_path / "req.json", tmp_path / "out.json"
    req_path.write_text(json.dumps(req.to_dict()))
    (tmp_path / "preload_probe.py").write_text(SCRIPT)
    cmd = ([sys.executable, "-m", "preload_probe"] if as_module
           else [sys.executable, str(tmp_path / "preload_probe.py")])
    proc_env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "NO_EXEC")}
    proc_env["PYTHONPATH"] = f"{ROOT}:{tmp_path}"
    if no_exec:
        proc_env["NO_EXEC"] = "1"
    proc = subprocess.Popen([*cmd, str(req_path), str(out)], env=proc_env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log
    return json.loads(out.read_text()) | {"launched_pid": proc.pid}


def _a_library_no_runner_maps(tmp_path: Path) -> str:
    for name in CANDIDATES:
        if any(os.path.exists(os.path.join(d, name)) for d in LIBDIRS):
            control = _serve(tmp_path, {"LD_PRELOAD": name}, as_module=False, no_exec=True)
            if control["preloaded"][name] is None:  # set too late: not mapped
                return name
    pytest.skip(f"none of {CANDIDATES} is installed and unmapped by a plain runner")


@pytest.mark.parametrize("as_module", [True, False], ids=["python -m", "script"])
def test_ld_preload_in_the_stage_env_is_loaded_into_the_engine_process(tmp_path, as_module):
    lib = _a_library_no_runner_maps(tmp_path)
    result = _serve(tmp_path, {"LD_PRELOAD": lib}, as_module=as_module)
    assert result["pid"] == result["launched_pid"]  # started again in place, not a child
    mapped = result["preloaded"][lib]
    assert mapped is not None and os.path.basename(mapped).startswith(lib)


def test_python_prefix_names_the_engines_own_environment():
    assert with_prefix({"LD_PRELOAD": "{python_prefix}/lib/libiomp5.so", "X": "1"}) == {
        "LD_PRELOAD": f"{sys.prefix}/lib/libiomp5.so", "X": "1"}


def test_an_entry_not_loaded_is_none():
    assert preloaded("/nonexistent/libnothing.so.9") == {"/nonexistent/libnothing.so.9": None}
