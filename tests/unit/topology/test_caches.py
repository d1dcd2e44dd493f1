from pathlib import Path

import pytest

from omni_ray.topology.caches import Cache, last_level_cache, read_caches
from omni_ray.topology.sysfs import parse_cache_size

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"
MiB = 1 << 20


@pytest.mark.parametrize("text,size", [("32768K", 32 * MiB), ("48K\n", 48 << 10),
                                       ("2M", 2 * MiB), ("1G", 1 << 30), ("512", 512)])
def test_parse_cache_size(text, size):
    assert parse_cache_size(text) == size


def test_parse_cache_size_rejects_garbage():
    with pytest.raises(ValueError, match="not a cache size: '32 MB-ish'"):
        parse_cache_size("32 MB-ish")


def test_epyc_vm_has_one_32_mib_l3_not_py_cpuinfo_s_1_mib():
    llc = last_level_cache(read_caches(FIXTURES / "caches_epyc_zen5_2c"))
    assert (llc.level, llc.size_bytes, llc.instances) == (3, 32 * MiB, ((0, 1),))
    assert llc.bytes_for([0]) == llc.bytes_for([0, 1]) == llc.bytes_for() == 32 * MiB
    assert llc.describe() == "32 MiB L3 x1 (CPUs 0-1)"
    assert llc.to_dict() == {"level": 3, "size_bytes": 32 * MiB, "instances": ["0-1"],
                             "total_bytes": 32 * MiB, "source": "sysfs"}


def test_two_socket_xeon_has_an_l3_per_socket():
    caches = read_caches(FIXTURES / "caches_xeon8480c_2s")
    assert {c.level for c in caches} == {1, 2, 3}
    llc = last_level_cache(caches)
    assert llc.size_bytes == 105 * MiB and len(llc.instances) == 2
    assert llc.bytes_for([0, 1]) == 105 * MiB        # one socket's cores reach one L3
    assert llc.bytes_for([0, 56]) == 210 * MiB       # one core on each socket: both
    assert llc.bytes_for() == 210 * MiB


def test_no_cache_directory_gives_none(tmp_path):
    (tmp_path / "devices/system/cpu/cpu0").mkdir(parents=True)
    assert read_caches(tmp_path) == []
    assert last_level_cache([]) is None


def test_instruction_caches_are_not_the_llc():
    caches = [Cache(1, "Data", 48 << 10, (0,)), Cache(2, "Instruction", 1 * MiB, (0,))]
    assert last_level_cache(caches).level == 1
