import pytest

from omni_ray.topology.sysfs import (
    format_cpulist,
    parse_cgroup_v2_path,
    parse_cpulist,
    parse_mem_total_mb,
    parse_node_meminfo,
)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)),
        ("0-3,8,10-11\n", (0, 1, 2, 3, 8, 10, 11)),  # as read from the file
        ("5", (5,)),
        ("0-0", (0,)),
        ("8,1,0-1", (0, 1, 8)),
        ("", ()),  # e.g. a memory-only node, or an empty cpuset
        ("\n", ()),
    ],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize(
    ("text", "match"),
    [("a", "'a'"), ("3-1", "range: '3-1'"), ("1-", "'1-'"), ("-1", "'-1'"), ("0x1", "'0x1'")],
)
def test_parse_cpulist_rejects(text, match):
    with pytest.raises(ValueError, match=match):
        parse_cpulist(text)


@pytest.mark.parametrize("cpus", [(), (0,), (0, 1, 2, 8), (0, 2, 4), tuple(range(56)) + (112,)])
def test_format_cpulist_round_trips(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == cpus


def test_format_cpulist_ranges():
    assert format_cpulist([8, 0, 1, 2, 10, 11]) == "0-2,8,10-11"


MEMINFO = """\
Node 0 MemTotal:       24000000 kB
Node 0 MemFree:        20000000 kB
Node 0 HugePages_Total:     0
"""


def test_parse_node_meminfo():
    fields = parse_node_meminfo(MEMINFO)
    assert fields == {"MemTotal": 24000000, "MemFree": 20000000, "HugePages_Total": 0}


def test_parse_mem_total_mb():
    assert parse_mem_total_mb(MEMINFO) == 24000000 // 1024


def test_parse_mem_total_mb_needs_memtotal():
    with pytest.raises(ValueError, match="MemTotal"):
        parse_mem_total_mb("Node 0 MemFree: 1 kB\n")


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("0::/user.slice/job-1\n", "/user.slice/job-1"),
        ("0::/\n", "/"),
        ("4:memory:/docker/abc\n3:cpuset:/\n0::/docker/abc\n", "/docker/abc"),
        ("4:memory:/docker/abc\n3:cpuset:/\n", None),  # cgroup v1 only
        ("", None),
    ],
)
def test_parse_cgroup_v2_path(text, path):
    assert parse_cgroup_v2_path(text) == path
