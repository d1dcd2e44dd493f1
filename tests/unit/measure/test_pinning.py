import os
import threading

import pytest

from omni_ray.measure import pinning
from omni_ray.measure.pinning import (MPOL_BIND, MPOL_PREFERRED, affinity_tree, bind_memory,
                                      current_mempolicy, mems_allowed, pin_all_threads,
                                      violations)


@pytest.fixture
def restore_affinity():
    before = os.sched_getaffinity(0)
    yield before
    pin_all_threads(before)


def test_pin_all_threads_reaches_every_thread(restore_affinity):
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    worker.start()  # a thread that exists before pinning, like an OpenMP pool
    try:
        tids = pin_all_threads([0])
        assert worker.native_id in tids and threading.get_native_id() in tids
        tree = affinity_tree(os.getpid())
        mine = tree[os.getpid()]
        assert set(tids) <= set(mine)
        assert all(cpus == [0] for cpus in mine.values())
        assert violations({os.getpid(): mine}, [0]) == []
    finally:
        stop.set()
        worker.join()
    pin_all_threads(restore_affinity)
    assert set(affinity_tree(os.getpid())[os.getpid()][threading.get_native_id()]) \
        == restore_affinity


def test_pin_to_a_missing_cpu_names_the_cpus(restore_affinity):
    with pytest.raises(OSError, match="sched_setaffinity\\(tid \\d+, CPUs 4096\\)"):
        pin_all_threads([4096])


def test_pin_empty_set_is_refused():
    with pytest.raises(ValueError, match="empty CPU set"):
        pin_all_threads([])


def test_violations_lists_threads_outside_the_set():
    tree = {10: {10: [0, 1], 11: [0, 1, 2, 3]}, 20: {20: [4]}}
    lines = violations(tree, [0, 1])
    assert lines == ["pid 10 tid 11: allowed on CPUs 0-3, outside 0-1: 2-3",
                     "pid 20 tid 20: allowed on CPUs 4, outside 0-1: 4"]
    assert violations(tree, range(8)) == []


def test_mems_allowed_reads_this_process():
    nodes = mems_allowed(os.getpid())
    assert nodes and 0 in nodes
    assert mems_allowed("self") == nodes
    assert mems_allowed(2**30) == []


def _in_thread(fn):
    """Memory policy is per thread: run the binding in a throwaway thread so pytest's main
    thread keeps the default policy."""
    out = {}
    t = threading.Thread(target=lambda: out.update(result=fn(), policy=current_mempolicy()))
    t.start()
    t.join()
    return out["result"], out["policy"]


def test_bind_memory_binds_the_calling_thread():
    result, policy = _in_thread(lambda: bind_memory(0))
    assert result and result.method == "libnuma" and result.mode == "bind"
    assert policy == (MPOL_BIND, [0])
    result, policy = _in_thread(lambda: bind_memory(0, strict=False))
    assert result.mode == "preferred" and policy == (MPOL_PREFERRED, [0])
    assert current_mempolicy()[0] == 0  # this thread untouched


def test_bind_memory_falls_back_to_the_syscall(monkeypatch):
    monkeypatch.setattr(pinning, "_bind_libnuma", lambda node, mode: "libnuma not loadable (x)")
    result, policy = _in_thread(lambda: bind_memory(0))
    assert result.ok and result.method == "syscall"
    assert "libnuma not loadable" in result.reason
    assert policy == (MPOL_BIND, [0])


def test_bind_memory_to_a_missing_node_says_why():
    result, policy = _in_thread(lambda: bind_memory(999))
    assert not result
    assert "libnuma:" in result.reason and "syscall: set_mempolicy failed: EINVAL" in result.reason
    assert result.to_dict()["ok"] is False
    assert policy[0] == 0


def test_bind_memory_negative_node():
    with pytest.raises(ValueError, match="node must be >= 0, got -1"):
        bind_memory(-1)


def test_a_simulated_node_the_kernel_lacks_is_recorded_not_bound():
    result, policy = _in_thread(lambda: pinning.bind_slot_memory(999, [1], simulated=True))
    assert not result and result.simulated
    assert result.reason == "not bound (node 999 is simulated)"
    assert result.to_dict()["simulated"] is True
    assert policy[0] == 0  # nothing was bound


def test_a_simulated_node_on_other_cpus_than_the_kernels_is_not_bound():
    result, _ = _in_thread(lambda: pinning.bind_slot_memory(0, [5], simulated=True,
                                                            kernel_cpus=frozenset({0, 1})))
    assert not result and result.reason == "not bound (node 0 is simulated)"


def test_a_simulated_node_the_kernel_has_with_the_slots_cpus_is_bound():
    result, policy = _in_thread(lambda: pinning.bind_slot_memory(0, [0], simulated=True,
                                                                 kernel_cpus=frozenset({0, 1})))
    assert result and result.simulated and policy == (MPOL_BIND, [0])


def test_normal_priority_takes_back_a_niceness_ray_gave(tmp_path):
    """A child started at niceness 15 (as Ray starts its workers) runs at 0 after the call,
    every thread of it, when it may (root); otherwise it says it stayed."""
    import subprocess
    import sys

    code = ("import os, threading, json\n"
            "from omni_ray.measure.pinning import normal_priority\n"
            "t = threading.Thread(target=lambda: __import__('time').sleep(2)); t.start()\n"
            "r = normal_priority()\n"
            "tids = os.listdir('/proc/self/task')\n"
            "r['threads'] = sorted({os.getpriority(os.PRIO_PROCESS, int(x)) for x in tids})\n"
            "print(json.dumps(r))\n")
    out = subprocess.run(["nice", "-n", "15", sys.executable, "-c", code], capture_output=True,
                         text=True, check=True, cwd=tmp_path,
                         env={**__import__("os").environ,
                              "PYTHONPATH": str(__import__("pathlib").Path(__file__)
                                                .resolve().parents[3])})
    r = __import__("json").loads(out.stdout)
    assert r["inherited"] == 15
    if __import__("os").geteuid() == 0:
        assert r["niceness"] == 0 and r["threads"] == [0]
    else:
        assert r["niceness"] == 15
