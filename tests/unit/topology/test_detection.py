import os
import shutil

import psutil
import pytest

from omni_ray.errors import UserError
from omni_ray.topology import allowed_cpus, detect
from omni_ray.topology.sysfs import parse_cpulist

from .conftest import SYSFS_FIXTURES, set_affinity


def smt2_cores(first: int, count: int, offset: int):
    return tuple((cpu, cpu + offset) for cpu in range(first, first + count))


def test_xeon8480c_2s():
    topo = detect(SYSFS_FIXTURES / "xeon8480c_2s")
    assert topo.source == "sysfs"
    assert [node.id for node in topo.nodes] == [0, 1]
    node0, node1 = topo.nodes
    assert node0.cpus == parse_cpulist("0-55,112-167")
    assert node1.cpus == parse_cpulist("56-111,168-223")
    assert node0.cores == smt2_cores(0, 56, 112)
    assert node1.cores == smt2_cores(56, 56, 112)
    assert node0.num_cores == node1.num_cores == 56
    assert 1_000_000 < node0.mem_total_mb < 1_100_000  # ~1 TB, in MiB


def test_captured_tree_has_no_cpu_model_or_flags():
    topo = detect(SYSFS_FIXTURES / "xeon8480c_2s")
    assert topo.cpu_model == "" and topo.flags == frozenset()


def test_four_node():
    topo = detect(SYSFS_FIXTURES / "four_node")
    assert [node.id for node in topo.nodes] == [0, 1, 2, 3]
    for node in topo.nodes:
        assert node.num_cores == 8 and len(node.cpus) == 16
        assert node.cores == smt2_cores(8 * node.id, 8, 32)


def test_cpu_offline_is_dropped():
    (node,) = detect(SYSFS_FIXTURES / "cpu_offline").nodes
    assert node.cpus == (0, 1, 2, 3, 4, 6, 7)
    assert node.cores == ((0, 4), (1,), (2, 6), (3, 7))


def test_cpu_absent_from_online_is_dropped_even_if_its_node_lists_it(copy_fixture):
    root = copy_fixture("cpu_offline")
    (root / "devices/system/node/node0/cpulist").write_text("0-7\n")
    assert 5 not in detect(root).nodes[0].cpus


def test_this_machine_capture():
    topo = detect(SYSFS_FIXTURES / "this_machine")
    assert topo.source == "sysfs"
    assert [(node.id, node.cpus, node.num_cores) for node in topo.nodes] == [(0, (0, 1), 2)]
    assert topo.nodes[0].mem_total_mb > 0


def test_siblings_from_core_cpus_list(copy_fixture):
    root = copy_fixture("four_node")
    for path in root.glob("devices/system/cpu/cpu*/topology/thread_siblings_list"):
        path.rename(path.with_name("core_cpus_list"))
    assert detect(root) == detect(SYSFS_FIXTURES / "four_node")


def test_siblings_from_package_and_core_id(copy_fixture):
    root = copy_fixture("four_node")
    for path in root.glob("devices/system/cpu/cpu*/topology/thread_siblings_list"):
        path.unlink()
    assert detect(root) == detect(SYSFS_FIXTURES / "four_node")


def test_without_core_files_each_cpu_is_a_core(copy_fixture):
    root = copy_fixture("four_node")
    shutil.rmtree(root / "devices/system/cpu")
    (root / "devices/system/cpu").mkdir()
    node0 = detect(root).nodes[0]
    assert node0.num_cores == 16 and node0.cores == tuple((cpu,) for cpu in node0.cpus)


def test_memory_only_node_is_left_out(copy_fixture):
    root = copy_fixture("cpu_offline")
    shutil.copytree(root / "devices/system/node/node0", root / "devices/system/node/node1")
    (root / "devices/system/node/node1/cpulist").write_text("\n")
    assert [node.id for node in detect(root).nodes] == [0]


def test_to_dict():
    data = detect(SYSFS_FIXTURES / "cpu_offline").to_dict()
    assert data["source"] == "sysfs" and data["flags"] == []
    assert data["nodes"][0]["cpus"] == [0, 1, 2, 3, 4, 6, 7]
    assert data["nodes"][0]["cores"] == 4
    assert data["nodes"][0]["siblings"] == [[0, 4], [1], [2, 6], [3, 7]]


def test_captured_tree_ignores_this_process_affinity(monkeypatch):
    set_affinity(monkeypatch, {0})
    assert len(detect(SYSFS_FIXTURES / "four_node").nodes) == 4


# errors naming the directory or file


def test_missing_root_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"sysfs_root: .*nowhere is not a directory"):
        detect(tmp_path / "nowhere")


def test_root_without_node_dir_is_a_user_error(tmp_path):
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    with pytest.raises(UserError, match=r"sysfs_root: .* has no devices/system/node"):
        detect(tmp_path)


def test_root_without_nodes_is_a_user_error(tmp_path):
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    (tmp_path / "devices/system/node").mkdir(parents=True)
    with pytest.raises(UserError, match="no NUMA node with online CPUs under"):
        detect(tmp_path)


def test_malformed_file_is_a_user_error_naming_it(copy_fixture):
    root = copy_fixture("cpu_offline")
    (root / "devices/system/node/node0/cpulist").write_text("0-x\n")
    with pytest.raises(UserError, match=r"node0/cpulist: not a CPU list item: '0-x'"):
        detect(root)


def test_missing_meminfo_is_a_user_error_naming_it(copy_fixture):
    root = copy_fixture("cpu_offline")
    (root / "devices/system/node/node0/meminfo").unlink()
    with pytest.raises(UserError, match=r"node0/meminfo: missing"):
        detect(root)


# the live machine (SYSFS_ROOT pointed at a temporary tree)


def test_live_without_node_dirs_falls_back_to_psutil(live, monkeypatch):
    set_affinity(monkeypatch, {0, 1, 3})
    topo = detect()
    assert topo.source == "psutil"
    (node,) = topo.nodes
    assert node.id == 0 and node.cpus == (0, 1, 3) and node.num_cores == 3
    assert node.mem_total_mb == psutil.virtual_memory().total // 2**20
    assert topo.cpu_model == "Test CPU" and topo.flags == {"avx512f"}


def test_live_honours_affinity(live, monkeypatch):
    shutil.copytree(SYSFS_FIXTURES / "four_node/devices", live / "devices")
    set_affinity(monkeypatch, {0, 1, 2, 32, 33, 8})
    topo = detect()
    assert topo.source == "sysfs"
    assert [(node.id, node.cores) for node in topo.nodes] == [
        (0, ((0, 32), (1, 33), (2,))),
        (1, ((8,),)),
    ]


def test_live_honours_cgroup_cpuset_of_nearest_ancestor(live, monkeypatch, tmp_path):
    shutil.copytree(SYSFS_FIXTURES / "four_node/devices", live / "devices")
    set_affinity(monkeypatch, range(64))
    (tmp_path / "proc_self_cgroup").write_text("0::/job/step\n")
    (live / "fs/cgroup/job/step").mkdir(parents=True)  # leaf without the cpuset controller
    (live / "fs/cgroup/job/cpuset.cpus.effective").write_text("0-3\n")
    assert allowed_cpus() == {0, 1, 2, 3}
    (node,) = detect().nodes
    assert node.cores == ((0,), (1,), (2,), (3,))


def test_detect_this_machine():
    topo = detect()
    assert topo.source in ("sysfs", "psutil")
    assert {cpu for node in topo.nodes for cpu in node.cpus} == allowed_cpus()
    assert set(allowed_cpus()) <= os.sched_getaffinity(0)
    assert all(node.num_cores >= 1 and node.mem_total_mb > 0 for node in topo.nodes)
