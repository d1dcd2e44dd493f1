"""An assumption about the platform, not omni-ray's code: libgomp (torch's OpenMP runtime)
honours GOMP_SPINCOUNT under OMP_WAIT_POLICY=ACTIVE. Paired comparisons (compare:,
docs/compare.md) rely on it: an engine left idle must stop spinning, or it takes the other
side's cores while that side's turn runs."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.environment

CHILD = """
import resource, time, torch
x = torch.randn(4096, 4096)
for _ in range(3):
    x.sum(dim=1)  # an OpenMP parallel region on every thread
time.sleep(0.5)  # past a short spin
r0 = resource.getrusage(resource.RUSAGE_SELF)
time.sleep(1.0)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
"""


def idle_cpu_s(env: dict) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=120, env={**env, "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


def test_a_finite_spin_count_lets_active_openmp_threads_go_idle():
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    active = dict(base, OMP_WAIT_POLICY="ACTIVE")
    # the spin count docs/compare.md advises: its worker thread sleeps well within the 0.5 s
    assert idle_cpu_s(dict(active, GOMP_SPINCOUNT="10000000")) < 0.2
    # without it the worker spins through the whole idle second
    assert idle_cpu_s(active) > 0.5
