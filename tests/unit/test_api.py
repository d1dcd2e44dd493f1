"""The API without Ray: a dry run plans, emits its plan to the consumer passed in, writes nothing."""

from __future__ import annotations

import io

import pytest

import omni_ray
from omni_ray import events
from omni_ray.cli.display import Progress
from omni_ray.errors import UserError

SWEEP = {"name": "dry", "model": "tiny", "stage": {"kv_cache_mib": 32},
         "matrix": {"batch": [1, 2, 4]}}


def test_a_dry_run_emits_its_plan_and_starts_nothing(tmp_path):
    seen: list[events.Event] = []
    report = omni_ray.run_sweep(SWEEP, out=tmp_path / "res", dry_run=True, passes=2,
                                on_event=seen.append)
    (plan,) = seen
    assert isinstance(plan, events.Planned) and plan.passes == 2
    ((sweep, arms, out_dir),) = plan.planned
    assert sweep.name == "dry" and list(arms) == report.arms and len(arms) == 3
    assert out_dir == report.out_dirs["dry"] and out_dir.parent == tmp_path / "res" / "dry"
    assert not (tmp_path / "res").exists()


def test_the_terminal_view_prints_the_plan(tmp_path):
    out = io.StringIO()
    omni_ray.run_sweep(SWEEP, out=tmp_path, dry_run=True, on_event=Progress(out))
    text = out.getvalue()
    assert text.startswith(f"sweep dry (<dict>): 3 arms x 3 passes -> {tmp_path / 'dry'}/")
    assert text.count("batch=") == 3 and text.endswith("dry run: nothing was started\n")


def test_passes_below_one_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="--passes: must be >= 1, got 0"):
        omni_ray.run_sweep(SWEEP, out=tmp_path, dry_run=True, passes=0)
