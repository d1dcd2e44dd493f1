from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from omni_ray.topology import detection

SYSFS_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"


@pytest.fixture
def copy_fixture(tmp_path):
    """Copy a captured tree into tmp_path so a test can break it."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(SYSFS_FIXTURES / name, dest)
        return dest

    return copy


@pytest.fixture
def live(tmp_path, monkeypatch):
    """Make ``detect()`` treat tmp_path/sys as the live /sys, with a fixed affinity and CPU."""
    root = tmp_path / "sys"
    root.mkdir()
    monkeypatch.setattr(detection, "SYSFS_ROOT", root)
    monkeypatch.setattr(detection, "PROC_CGROUP", tmp_path / "proc_self_cgroup")
    monkeypatch.setattr(detection, "cpu_features", lambda: ("Test CPU", frozenset({"avx512f"})))
    return root


def set_affinity(monkeypatch, cpus) -> None:
    monkeypatch.setattr(detection.os, "sched_getaffinity", lambda pid: set(cpus))
