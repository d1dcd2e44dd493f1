from omni_ray.placement.schedule import Job, Scheduler, interleaved_jobs, pick_slot


def test_pass_p_starts_at_arm_p_minus_1():
    jobs = interleaved_jobs(3, 3)
    firsts = [jobs[i].arm_index for i in (0, 3, 6)]
    assert firsts == [0, 1, 2]
    assert [j.arm_index for j in jobs[3:6]] == [1, 2, 0]
    assert {(j.arm_index, j.pass_no) for j in jobs} == {(a, p) for a in range(3) for p in (1, 2, 3)}


def test_passes_land_on_different_slots_when_they_can():
    s = Scheduler(interleaved_jobs(1, 2), ["n0s0", "n0s1"])
    (j1, a), = [s.next()]
    s.done(a)  # a is free again, and first in line would be n0s1 anyway; prefer the unused one
    j2, b = s.next()
    assert (j1.pass_no, j2.pass_no) == (1, 2) and a != b


def test_pick_slot_falls_back_to_a_used_slot():
    assert pick_slot(["n0s0"], {"n0s0"}) == "n0s0"
    assert pick_slot(["n0s0", "n0s1"], {"n0s0"}) == "n0s1"


def test_n_slots_run_n_jobs_at_once():
    s = Scheduler(interleaved_jobs(4, 1), ["a", "b"])
    got = [s.next(), s.next(), s.next()]
    assert got[2] is None and {got[0][1], got[1][1]} == {"a", "b"}
    s.done("a")
    assert s.next() == (Job(2, 1), "a")
