"""What a sweep emits while it runs. A consumer is any ``callable(event)``; the CLI passes its
terminal view (``omni_ray.cli.display.Progress``), and Prometheus metrics or a store could be
others. The API emits these and imports no consumer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Planned:
    """A dry run's plan: ``(sweep, arms, out_dir)`` per sweep; ``passes`` overrides the files'."""

    planned: tuple[tuple[Any, tuple, Any], ...]
    passes: int | None


@dataclasses.dataclass(frozen=True)
class Started:
    """Ray is up: ``total`` arm passes to run, ``skipped`` already recorded (resume)."""

    total: int
    skipped: int
    dashboard_url: str | None


@dataclasses.dataclass(frozen=True)
class Monitoring:
    """``--monitor``: Prometheus answers at ``url``; ``graphs`` links each omni-ray metric to
    its graph; ``moved`` says why the port is not the one asked for (else None)."""

    url: str
    graphs: dict
    moved: str | None


@dataclasses.dataclass(frozen=True)
class ArmStarted:
    """One arm pass went to ``slot``."""

    task: Any
    slot: str


@dataclasses.dataclass(frozen=True)
class ArmProgress:
    """What a running arm pass is doing now: ``phase`` ("starting": the engine process is
    importing; "probing": the slot's bandwidth probe; "loading": building the engine;
    "measuring": running the workload) and the
    engine tree's RssAnon in MiB (None until the first reading)."""

    task: Any
    slot: str
    phase: str
    rss_mb: float | None


@dataclasses.dataclass(frozen=True)
class ArmDone:
    """One arm pass is recorded (``record["status"]`` says whether it ran)."""

    task: Any
    record: dict


@dataclasses.dataclass(frozen=True)
class Note:
    """A line to show as it is (a paired comparison starting or done)."""

    text: str


@dataclasses.dataclass(frozen=True)
class Finished:
    """The run is over; ``report`` is what ``run_sweep`` returns."""

    report: Any


Event = (Planned | Started | Monitoring | ArmStarted | ArmProgress | ArmDone | Note
         | Finished)
Consumer = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The consumer when nobody listens."""
