"""The LLC in the provenance block (its own file: test_provenance.py is being extended too)."""

from pathlib import Path

from omni_ray.results import provenance
from omni_ray.topology import caches

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"


def test_collect_records_the_llc_read_from_sysfs(monkeypatch):
    monkeypatch.setattr(caches, "SYSFS_ROOT", FIXTURES / "caches_epyc_zen5_2c")
    provenance.last_level_cache.cache_clear()
    try:
        llc = provenance.collect(cpu=False)["llc"]
    finally:
        provenance.last_level_cache.cache_clear()
    assert llc == {"level": 3, "size_bytes": 32 << 20, "instances": ["0-1"],
                   "total_bytes": 32 << 20, "source": "sysfs"}


def test_no_caches_in_sysfs_records_none(monkeypatch, tmp_path):
    monkeypatch.setattr(caches, "SYSFS_ROOT", tmp_path)
    provenance.last_level_cache.cache_clear()
    try:
        assert provenance.collect(cpu=False)["llc"] is None
    finally:
        provenance.last_level_cache.cache_clear()
