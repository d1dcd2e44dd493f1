"""omni-ray sweep on a bad serving workload: one line naming file, field and value, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

INVALID = Path(__file__).resolve().parents[2] / "configs" / "invalid"


@pytest.mark.parametrize("name, field", [
    ("serving_rate_zero", "workload.request_rate: must be > 0"),
    ("serving_percentile_100", "workload.percentiles[1]: must be a number in (0, 100), got 100"),
    ("serving_slo_unknown", "workload.slo.itl_ms: not a metric with an SLO"),
    ("serving_prompt_file_missing", "workload.prompt_file: no such prompt file"),
    ("serving_prompt_file_empty", "workload.prompt_file: holds no prompt"),
    ("serving_users_with_rate", "workload.request_rate: has no meaning with users"),
    ("serving_duration_inf_unbounded", "workload.request_rate: inf with duration_s"),
    ("serving_search_over_fraction", "workload.search.low: must be an integer, got 1.5"),
])
def test_sweep_refuses_in_one_line(user_error, name, field):
    path = INVALID / f"{name}.yaml"
    line = user_error("sweep", path, "--dry-run")
    assert str(path) in line and field in line, line
