"""Retracting a result in place: the record keeps its data and gains ``retracted``,
``retracted_on``, ``reason`` and ``superseded_by`` (``results.record.retract``), written
atomically. A run directory is retracted by retracting each of its records."""

from __future__ import annotations

import os
from pathlib import Path

from omni_ray.errors import UserError
from omni_ray.report.run import RECORD_GLOB, read_record, record_files
from omni_ray.results.record import retract
from omni_ray.results.store import read_json, write_json_atomic


def _targets(path: Path) -> list[Path]:
    if path.is_file():
        read_record(path)  # a UserError when it is not a sweep arm record
        return [path]
    if path.is_dir():
        files = []
        for f in record_files(path, RECORD_GLOB):  # other JSON files there are not retracted
            read_record(f)  # all or nothing: refuse before changing any file
            files.append(f)
        if not files:
            raise UserError(f"{path}: not a result (no *.pN.json arm records in it)")
        return files
    raise UserError(f"{path}: no such result file or run directory")


def retract_result(result: str | os.PathLike, reason: str,
                   superseded_by: str | os.PathLike | None = None, *,
                   on: str | None = None) -> list[Path]:
    """Mark the record file or every record of the run directory ``result`` retracted; returns
    the files changed. Already retracted (the record, or every record of the run), an empty
    reason or a path that is not a result: a one-line UserError, and no file is changed."""
    path = Path(result)
    if not reason or not reason.strip():
        raise UserError(f"{path}: --reason must say why the result is retracted")
    if superseded_by is not None and not Path(superseded_by).exists():
        raise UserError(f"--superseded-by {superseded_by}: no such file or directory")
    files = _targets(path)
    raw = {f: read_json(f) for f in files}
    todo = [f for f in files if not raw[f].get("retracted")]
    if not todo:
        first = raw[files[0]]
        what = "record" if path.is_file() else "run (every record)"
        raise UserError(f"{path}: {what} already retracted on {first.get('retracted_on')}: "
                        f"{first.get('reason')}")
    sup = None if superseded_by is None else str(superseded_by)
    for f in todo:
        write_json_atomic(f, retract(raw[f], reason.strip(), sup, on=on))
    return todo
