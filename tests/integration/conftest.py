"""Timeouts for integration modules whose tests outlast pytest-timeout's default (900 s)."""

from __future__ import annotations

import pytest

# module file -> seconds per test: test_cpu_int4's module fixtures quantize and start several
# engines, among them compiled ones with a 600 s cap each, inside the first test that needs them.
LONG_MODULES = {"test_cpu_int4.py": 2400}


def pytest_collection_modifyitems(items):
    for item in items:
        seconds = LONG_MODULES.get(item.path.name)
        if seconds and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds))


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module, started as a sweep starts it (this machine's slots of one
    core and of a whole node; the session's temp dir and token, tests/conftest.py); run_sweep
    uses it and leaves it running. Stopped at the module's end: it is this process's own."""
    import ray

    from omni_ray.placement.cluster import connect

    connect(None, [1, None])
    yield
    ray.shutdown()
