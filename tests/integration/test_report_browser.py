"""The HTML report of a real run, opened from disk in headless Chromium: every chart is drawn.

"A real run" here is a kept run directory under results/ (kv_budget: three arms, three passes,
real records with the tree sampler's memory samples) copied to the test's tmp dir; real sweeps
are run by test_sweep.py, and this test does not start another. Chromium is driven by
tests/integration/browser.py (skips without Debian's chromium package, saying how to get it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from omni_ray.report import write_report
from tests.integration.browser import Browser

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "results" / "kv_budget" / "20261202T113422Z"

# For every <img>: its decoded size and its laid-out size on the page.
_IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => {
  const r = i.getBoundingClientRect();
  return {alt: i.alt, complete: i.complete, natural: [i.naturalWidth, i.naturalHeight],
          box: [r.width, r.height]};
}))"""


def test_report_of_a_real_run_draws_every_chart_in_chromium(tmp_path):
    assert RUN.is_dir(), f"the kept run {RUN} is gone: point the test at another under results/"
    run = tmp_path / "kv_budget" / RUN.name
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("logs", "report.*"))
    report = write_report([run])
    with Browser(tmp_path) as browser:
        page = browser.open(report.as_uri(), until=_IMAGES_JS, screenshot="report.png")
    images, errors = json.loads(page.value), page.errors
    assert errors == []
    # 12 metrics by kv_cache_mib, the Pareto chart, memory over time for each of the 3 arms
    assert len(images) >= 12 + 1 + 3, [i["alt"] for i in images]
    undrawn = [i for i in images if not (i["complete"] and min(i["natural"]) > 0
                                          and min(i["box"]) > 0)]
    assert undrawn == []
    alts = {i["alt"] for i in images}
    assert {"throughput vs memory", "memory over time kv_cache_mib=64"} <= alts
    png = (tmp_path / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 50_000
