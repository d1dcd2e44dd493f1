import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from omni_ray.errors import UserError
from omni_ray.measure.cpuload import (SLOT_MAX_AVG, NeighbourLoad, busy_between, check_idle,
                                      contended_during, cpu_busy, judge, neighbour_share,
                                      parse_proc_stat, tree_cpu_s)

STAT_HEAD = "cpu  100 0 100 1000 0 0 0 0 0 0\n"


def stat_text(rows):
    """rows: cpu -> (user, system, idle, iowait) in jiffies."""
    body = "".join(f"cpu{c} {u} 0 {s} {i} {w} 0 0 0 0 0\n" for c, (u, s, i, w) in rows.items())
    return STAT_HEAD + body + "intr 12345\nctxt 999\n"


def test_parse_proc_stat():
    text = stat_text({0: (10, 5, 80, 5), 1: (0, 0, 100, 0)})
    assert parse_proc_stat(text) == {0: (15, 100), 1: (0, 100)}


def test_guest_time_is_not_counted_twice():
    # user 50 already includes guest 40; total is user..steal only.
    text = "cpu0 50 0 0 50 0 0 0 0 40 0\n"
    assert parse_proc_stat(text) == {0: (50, 100)}


def test_busy_between_and_iowait_counts_as_idle():
    before = parse_proc_stat(stat_text({0: (0, 0, 0, 0), 1: (0, 0, 0, 0)}))
    after = parse_proc_stat(stat_text({0: (30, 10, 50, 10), 1: (0, 0, 100, 0)}))
    assert busy_between(before, after, [0, 1]) == {0: 0.4, 1: 0.0}


def test_no_elapsed_jiffies_means_idle():
    same = parse_proc_stat(stat_text({0: (1, 1, 1, 1)}))
    assert busy_between(same, same, [0]) == {0: 0.0}


def test_missing_cpu_is_a_user_error():
    s = parse_proc_stat(stat_text({0: (0, 0, 0, 0), 1: (0, 0, 0, 0)}))
    with pytest.raises(UserError, match="CPUs 5,7 are not in /proc/stat.*present: 0-1"):
        busy_between(s, s, [0, 5, 7])


def fake_reader(texts):
    it = iter(texts)
    return lambda: next(it)


def test_check_idle_passes_quiet_cores():
    r = fake_reader([stat_text({0: (0, 0, 0, 0), 1: (0, 0, 0, 0)}),
                     stat_text({0: (2, 0, 98, 0), 1: (1, 0, 99, 0)})])
    check = check_idle([0, 1], 0.5, reader=r, sleep=lambda s: None)
    assert check.ok and bool(check)
    assert check.per_cpu == {0: 0.02, 1: 0.01}
    assert "idle" in check.message
    assert check.to_dict()["per_cpu"] == {"0": 0.02, "1": 0.01}


def test_check_idle_refuses_a_busy_average():
    r = fake_reader([stat_text({0: (0, 0, 0, 0), 1: (0, 0, 0, 0)}),
                     stat_text({0: (10, 0, 90, 0), 1: (10, 0, 90, 0)})])
    check = check_idle([0, 1], 0.5, reader=r, sleep=lambda s: None)
    assert not check.ok
    assert check.message == ("CPUs 0-1 are in use by something else: average 10.0% > 5% "
                             "(over 0.5 s)")


def test_one_hot_core_refuses_even_when_the_average_is_low():
    per_cpu = {c: 0.0 for c in range(20)}
    per_cpu[7] = 0.6  # average 3 %, one core 60 %
    check = judge(per_cpu, window_s=1)
    assert not check.ok
    assert "cpu7 at 60.0% > 50%" in check.message and "average" not in check.message


def test_thresholds_are_parameters():
    assert judge({0: 0.3}, max_avg=0.5, max_one=0.9).ok
    assert not judge({0: 0.3}, max_avg=0.2, max_one=0.9).ok


def test_cpu_busy_on_the_real_proc_stat_sees_a_spinning_process():
    cpu = min(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        time.sleep(0.3)  # let it start spinning
        busy = cpu_busy([cpu], window_s=0.5)
    finally:
        spin.kill()
        spin.wait()
    assert set(busy) == {cpu} and busy[cpu] > 0.8  # a core running one busy loop is busy


def test_empty_cpu_set():
    with pytest.raises(ValueError, match="empty CPU set"):
        cpu_busy([])


def test_a_slot_tolerates_omni_rays_own_background_but_not_a_neighbour():
    # 6.1 % on the slot's one core: Ray's daemons and kdamond while the other slot's engine
    # starts (the smoke demo once refused a slot for this under the 5 % default)
    assert not judge({1: 0.061}, window_s=0.5).ok
    assert judge({1: 0.061}, max_avg=SLOT_MAX_AVG, window_s=0.5).ok
    assert not judge({1: 0.3}, max_avg=SLOT_MAX_AVG, window_s=0.5).ok


def test_neighbour_share_is_busy_time_the_engine_did_not_use():
    assert neighbour_share(busy_s=3.0, own_cpu_s=2.0, window_s=5.0, n_cpus=1) == pytest.approx(0.2)
    assert neighbour_share(busy_s=1.0, own_cpu_s=1.2, window_s=5.0, n_cpus=2) == 0.0  # ticks
    with pytest.raises(ValueError):
        neighbour_share(1.0, 0.0, 0.0, 1)


def test_neighbour_load_from_faked_stat_and_tree_times():
    tick = os.sysconf("SC_CLK_TCK")
    texts = iter([stat_text({0: (0, 0, 0, 0), 1: (0, 0, 0, 0)}),
                  stat_text({0: (4 * tick, 0, 1 * tick, 0), 1: (5 * tick, 0, 0, 0)})])
    clock, tree = iter([10.0, 15.0]), iter([100.0, 106.0])
    load = NeighbourLoad(1, [0, 1], reader=lambda: next(texts), clock=lambda: next(clock),
                         tree_cpu=lambda pid: next(tree))
    out = load.stop()  # 9 busy CPU-seconds of 10, the engine used 6: 3 were a neighbour's
    assert out["neighbour_cpu_frac"] == pytest.approx(0.3)
    assert (out["slot_busy_cpu_s"], out["engine_cpu_s"], out["neighbour_window_s"]) == (9, 6, 5)
    assert "30%" in contended_during(out) and contended_during({"neighbour_cpu_frac": 0.1}) is None
    texts = iter([stat_text({0: (0, 0, 0, 0)}), stat_text({0: (tick, 0, 0, 0)})])
    clock, tree = iter([10.0, 11.0]), iter([0.0, 0.0])
    short = NeighbourLoad(1, [0], reader=lambda: next(texts), clock=lambda: next(clock),
                          tree_cpu=lambda pid: next(tree)).stop()
    assert short["neighbour_cpu_frac"] is None and contended_during(short) is None  # 1 s: too short


def test_neighbour_load_sees_a_real_spinning_neighbour_and_not_the_engine_itself():
    """On the real /proc: CPU time burnt by a child (in the engine's tree) is the engine's; the
    same burnt by a process outside the tree, on the same CPU, is a neighbour's. Each burns a
    fixed CPU time, so other load on the machine only stretches the wait. This process, the
    "engine", is pinned to the CPU as an engine is to its slot: the slot's busy time less the
    tree's CPU time is the neighbour's only while the tree runs on the slot (unpinned, this
    process's own 0.15 s on the other CPU once took that much off the outsider's share). Every
    thread of it, as the engine's are (``pin_all_threads``): pytest's process has thread pools."""
    from omni_ray.measure.pinning import pin_all_threads

    saved = os.sched_getaffinity(0)
    cpu = min(saved)
    pin_all_threads({cpu})
    try:
        mine, theirs = _burn_inside_then_outside_the_tree(cpu)
    finally:
        pin_all_threads(saved)
    assert mine["engine_cpu_s"] >= 2.4  # the reaped child's 2.5 s are the engine's
    assert theirs["engine_cpu_s"] < 1.0
    assert theirs["slot_busy_cpu_s"] - theirs["engine_cpu_s"] >= 2.4  # the outsider's 2.5 s
    assert theirs["neighbour_cpu_frac"] is not None and theirs["neighbour_cpu_frac"] > 0


def _burn_inside_then_outside_the_tree(cpu: int) -> tuple[dict, dict]:
    import psutil

    pin = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731
    burn = [sys.executable, "-c", "import time\nwhile time.process_time() < 2.5: pass"]
    mine = NeighbourLoad(os.getpid(), [cpu])
    subprocess.run(burn, preexec_fn=pin, check=True)  # a child, reaped: inside the tree
    mine = mine.stop()
    theirs = NeighbourLoad(os.getpid(), [cpu])
    # outside the tree: started by a shell that exits at once, so init adopts it
    pid = int(subprocess.run(["sh", "-c", '"$@" >/dev/null 2>&1 & echo $!', "sh", *burn],
                             preexec_fn=pin, capture_output=True, text=True, check=True).stdout)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # it ends itself; this is in case it did not
    return mine, theirs.stop()
