"""Shared fixtures: synthetic models (built once, cached) and a runner for real engine processes."""

from __future__ import annotations

import pytest


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
