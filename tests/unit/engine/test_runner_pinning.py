"""The runner reads the pinning back at ready and after the workload: a thread moved off the slot
while measuring is a violation too, and says when it was seen."""

from omni_ray.engine import runner


def test_a_thread_moved_off_the_slot_after_ready_is_a_violation(monkeypatch):
    trees = iter([{10: {10: [0], 11: [0]}}, {10: {10: [0], 11: [1]}}, {10: {10: [0], 11: [1]}}])
    monkeypatch.setattr(runner, "affinity_tree", lambda pid: next(trees))
    readback = runner.PinningReadback(10, [0])
    readback("ready")
    pinning = readback.into({})
    assert pinning["violations"] == [] and pinning["allowed_cpus"] == [0]
    readback("end")
    readback("end")  # seen again: still one violation, first seen at the end
    pinning = readback.into({})
    (line,) = pinning["violations"]
    assert line.startswith("end: ") and "11" in line
    assert pinning["allowed_cpus"] == [0, 1] and pinning["read_back"] == ["ready", "end"]
    assert pinning["threads"] == 2 and pinning["processes"] == 1
