import os
import subprocess
import sys
import time

import pytest

from omni_ray.measure import sampler as sampler_mod
from omni_ray.measure.sampler import Sample, TreeSampler, self_rss_anon_mb, tree_pids, tree_rss

ALLOC_MB = 200

# A child that touches ALLOC_MB of anonymous memory, says "ready", then waits to be killed.
# With GRANDCHILD=1 it first starts a grandchild doing the same with 100 MB.
CHILD = f"""
import os, subprocess, sys, time
kids = []
if os.environ.get("GRANDCHILD") == "1":
    env = dict(os.environ, GRANDCHILD="0", ALLOC_MB="100")
    kids.append(subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[1]], env=env,
                                 stdout=subprocess.PIPE, text=True))
    kids[0].stdout.readline()
block = b"\\x01" * (int(os.environ.get("ALLOC_MB", "{ALLOC_MB}")) << 20)
print("ready", flush=True)
time.sleep(60)
"""


def _spawn(grandchild=False):
    env = dict(os.environ, GRANDCHILD="1" if grandchild else "0")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, CHILD], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _kill_tree(proc):
    for pid in reversed(tree_pids(proc.pid)):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


@pytest.fixture
def child():
    proc = _spawn()
    yield proc
    _kill_tree(proc)


def test_tree_rss_sees_the_child_above_the_parent_alone(child):
    me = os.getpid()
    alone = self_rss_anon_mb(me)
    anon, file_mb, pids = tree_rss(me)
    assert me in pids and child.pid in pids
    assert anon >= alone + ALLOC_MB * 0.9
    assert file_mb > 0


def test_sampler_finds_a_child_born_after_start_and_marks_windows():
    me = os.getpid()
    with TreeSampler(me, interval_s=0.01, rescan_s=0.05) as s:
        time.sleep(0.05)
        base = s.last_anon_mb()
        proc = _spawn()
        try:
            time.sleep(0.2)  # > rescan_s: the sampler has found the child
            s.mark("loaded")
            loaded = s.last_anon_mb()
        finally:
            _kill_tree(proc)
        time.sleep(0.3)
        s.mark("after")
    assert proc.pid in s.pids_seen and me in s.pids_seen
    assert loaded >= base + ALLOC_MB * 0.9
    assert s.peak_anon_mb("start", "loaded") >= base + ALLOC_MB * 0.9
    assert s.peak_anon_mb() == max(x.rss_anon_mb for x in s.samples)
    # The child is gone: the tail of the run is back near the parent alone.
    assert s.settled_anon_mb(window_s=0.1) < base + ALLOC_MB * 0.5
    assert s.peak_anon_mb("after", "stop") < base + ALLOC_MB * 0.5
    assert len(s.samples) > 10
    assert all(a.t <= b.t for a, b in zip(s.samples, s.samples[1:]))


def test_sampler_walks_grandchildren():
    proc = _spawn(grandchild=True)
    try:
        pids = tree_pids(proc.pid)
        assert len(pids) == 2 and pids[0] == proc.pid
        with TreeSampler(proc.pid, interval_s=0.01) as s:
            time.sleep(0.05)
        assert s.peak_anon_mb() >= (ALLOC_MB + 100) * 0.9
        assert max(x.n_procs for x in s.samples) == 2
    finally:
        _kill_tree(proc)


def test_tree_pids_falls_back_to_the_ppid_scan(child, monkeypatch):
    monkeypatch.setattr(sampler_mod, "_children_from_task_files", lambda pid: None)
    assert child.pid in tree_pids(os.getpid())


def test_a_vanished_root_gives_empty_readings():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert tree_rss(proc.pid) == (0.0, 0.0, [])
    with pytest.raises(ProcessLookupError, match=f"process {proc.pid} is gone"):
        self_rss_anon_mb(proc.pid)
    with TreeSampler(proc.pid, interval_s=0.01) as s:
        time.sleep(0.03)
    assert s.peak_anon_mb() == 0.0 and s.pids_seen == set()


def test_unknown_mark_is_a_readable_error():
    s = TreeSampler(os.getpid())
    s.mark("a")
    with pytest.raises(KeyError, match="no mark 'b'; marks are \\['a'\\]"):
        s.peak_anon_mb("a", "b")


def test_bad_interval_is_refused():
    with pytest.raises(ValueError, match="interval_s and rescan_s must be > 0"):
        TreeSampler(1, interval_s=0)


def test_to_dict_downsamples_but_keeps_the_peak():
    s = TreeSampler(os.getpid())
    s._t0 = 100.0
    s.samples = [Sample(100.0 + i * 0.02, 10.0 + (i % 7), 5.0, 1) for i in range(1000)]
    s.samples[503] = Sample(s.samples[503].t, 999.0, 5.0, 3)
    s.marks = {"start": 100.0, "loaded": 110.0}
    d = s.to_dict(max_samples=50)
    assert d["unit"] == "MiB" and d["interval_s"] == 0.02
    assert d["n_samples"] == 1000 and len(d["samples"]) == 50 and d["downsampled"]
    assert d["peak_anon_mb"] == 999.0
    assert max(row[1] for row in d["samples"]) == 999.0
    assert d["marks"] == {"start": 0.0, "loaded": 10.0}
    assert d["columns"] == ["t_s", "rss_anon_mb", "rss_file_mb", "n_procs"]
    assert d["max_procs"] == 3


def test_settled_is_the_median_of_the_tail():
    s = TreeSampler(os.getpid())
    s.samples = [Sample(0.0, 500.0, 0, 1)] + [Sample(1.0 + i * 0.1, v, 0, 1)
                                               for i, v in enumerate([100.0, 101.0, 300.0, 102.0])]
    assert s.settled_anon_mb(window_s=0.35) == 101.5
    assert TreeSampler(1).settled_anon_mb() is None


def test_thread_error_surfaces_on_stop(monkeypatch):
    def boom(pid):
        raise RuntimeError("proc exploded")

    s = TreeSampler(os.getpid(), interval_s=0.01)
    s.start()
    monkeypatch.setattr(sampler_mod, "tree_pids", boom)
    s._last_scan = float("-inf")
    time.sleep(0.05)
    with pytest.raises(RuntimeError, match="proc exploded"):
        s.stop()
    assert "proc exploded" in s.to_dict()["error"]
