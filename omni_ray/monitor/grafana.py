"""omni-ray's Grafana dashboard, and its place in the Grafana provisioning Ray writes.

Ray writes ``<session>/metrics/grafana/`` (grafana.ini, a Prometheus datasource, a dashboard
provider reading every JSON file of ``dashboards/``); a file copied there shows up next to Ray's
own dashboards in a Grafana started on that provisioning. omni-ray builds no Grafana of its own.

    python -m omni_ray.monitor.grafana [SESSION_DIR]   # default: the latest local Ray session
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

DASHBOARD = Path(__file__).with_name("dashboards") / "omni_ray.json"


def latest_session() -> Path:
    """``session_latest`` of the local Ray's temp dir (RAY_TMPDIR, else /tmp)."""
    return Path(os.environ.get("RAY_TMPDIR") or "/tmp") / "ray" / "session_latest"


def install(session_dir: str | Path) -> Path:
    """Copy the dashboard into the session's Grafana dashboards folder; returns the copy."""
    target = Path(session_dir) / "metrics" / "grafana" / "dashboards"
    if not target.is_dir():
        raise FileNotFoundError(f"{target}: not a Ray session's Grafana dashboards folder "
                                "(Ray writes it when it starts with the dashboard)")
    return Path(shutil.copy2(DASHBOARD, target / "omni_ray_grafana_dashboard.json"))


def main(argv: list[str]) -> int:
    session = Path(argv[0]) if argv else latest_session()
    try:
        print(install(session.resolve()))
    except FileNotFoundError as exc:
        print(f"omni_ray.monitor.grafana: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
