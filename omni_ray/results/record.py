"""The result record: one versioned, self-describing dict per benchmark point.

A record carries its schema version, the resolved config and its hash, the measurements, the
status (a failed or timed-out point is a record too, with its error and stderr tail), the pinning
read-back and the provenance block. Records are write-once: a wrong result is retracted (marked,
with a reason and what supersedes it), never deleted or edited. Old records upgrade on read,
never break.

Schema history:
  0  (no ``schema_version`` key) the first harness: ``results`` or ``metrics`` instead of
     ``measurements``, an ``ok`` bool instead of ``status``, no config hash.
  1  ``schema_version``, ``kind``, ``status``, ``config_hash``, ``config``, ``measurements``,
     ``error``, ``stderr_tail``, ``pinning``, ``provenance`` (+ caller's extra keys).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import hashlib
import json
from typing import Any

from omni_ray.errors import UserError

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "timeout")

_RETRACTION_KEYS = ("retracted", "retracted_on", "reason", "superseded_by")


def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _as_dict(config: Any) -> dict:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict or dataclass, got {type(config).__name__}")
    return config


def config_hash(config: Any) -> str:
    """First 16 hex digits of sha256 over the canonical JSON of ``config`` (sorted keys, no
    spaces): equal configs hash equal whatever their key order."""
    try:
        text = _canonical_json(_as_dict(config))
    except (TypeError, ValueError) as e:
        raise TypeError(f"config is not canonical-JSON serialisable: {e}") from e
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def make_record(*, kind: str, config: Any, measurements: dict, status: str,
                error: str | None = None, stderr_tail: str | None = None,
                pinning: dict | None = None, provenance: dict | None = None,
                extra: dict | None = None) -> dict:
    """Build a schema-version-1 record (copies its inputs).

    ``provenance=None`` collects it now (``results.provenance.collect()``); pass ``{}`` to leave
    it empty. ``extra`` keys (e.g. ``arm``, ``pass``) go at the top level and may not shadow the
    core keys. A record that is not "ok" must say why in ``error``."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind must be a non-empty string, got {kind!r}")
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    if status != "ok" and not error:
        raise ValueError(f"a {status!r} record needs an error message")
    if not isinstance(measurements, dict):
        raise TypeError(f"measurements must be a dict, got {type(measurements).__name__}")
    config = copy.deepcopy(_as_dict(config))
    if provenance is None:
        from omni_ray.results.provenance import collect

        provenance = collect()
    record = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "status": status,
        "config_hash": config_hash(config),
        "config": config,
        "measurements": copy.deepcopy(measurements),
        "error": error,
        "stderr_tail": stderr_tail,
        "pinning": copy.deepcopy(pinning),
        "provenance": copy.deepcopy(provenance),
    }
    for key, value in (extra or {}).items():
        if key in record or key in _RETRACTION_KEYS:
            raise ValueError(f"extra key {key!r} would shadow a record field")
        record[key] = copy.deepcopy(value)
    return record


def _upgrade_0_to_1(old: dict) -> dict:
    rec = dict(old)
    if "measurements" not in rec:
        for legacy in ("results", "metrics"):
            if isinstance(rec.get(legacy), dict):
                rec["measurements"] = rec.pop(legacy)
                break
        else:
            rec["measurements"] = {}
    if "status" not in rec:
        ok = rec.pop("ok", None)
        if ok is None:
            ok = not rec.get("error")
        rec["status"] = "ok" if ok else "failed"
    rec.setdefault("kind", "unknown")
    rec.setdefault("config", {})
    for key in ("error", "stderr_tail", "pinning", "provenance"):
        rec.setdefault(key, None)
    try:
        rec.setdefault("config_hash", config_hash(rec["config"]))
    except TypeError:
        rec.setdefault("config_hash", None)
    rec["schema_version"] = 1
    return rec


_UPGRADES = {0: _upgrade_0_to_1}


def upgrade(record: dict, *, source: str = "") -> dict:
    """Return ``record`` at ``SCHEMA_VERSION`` (a new dict; the input is not changed).

    Unknown keys are kept. A record from a newer omni-ray is a ``UserError`` (``source``, e.g.
    the file name, is put in front of the message)."""
    where = f"{source}: " if source else ""
    if not isinstance(record, dict):
        raise UserError(f"{where}not a result record (a JSON object), got {type(record).__name__}")
    version = record.get("schema_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise UserError(f"{where}schema_version must be a non-negative integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise UserError(f"{where}schema_version {version} is newer than this omni-ray reads "
                        f"({SCHEMA_VERSION}): upgrade omni-ray")
    rec = copy.deepcopy(record)
    upgraded_from = version
    while version < SCHEMA_VERSION:
        rec = _UPGRADES[version](rec)
        version = rec["schema_version"]
    if upgraded_from != SCHEMA_VERSION:
        rec["upgraded_from"] = upgraded_from
    return rec


def retract(record: dict, reason: str, superseded_by: str | None,
            *, on: str | None = None) -> dict:
    """A copy of ``record`` marked retracted, data kept: ``retracted``, ``retracted_on`` (UTC ISO
    time, or ``on``), ``reason``, ``superseded_by`` (a file or record id, or None)."""
    if not reason or not reason.strip():
        raise ValueError("a retraction needs a reason")
    if record.get("retracted"):
        raise ValueError(f"record is already retracted (on {record.get('retracted_on')}: "
                         f"{record.get('reason')})")
    rec = copy.deepcopy(record)
    rec["retracted"] = True
    rec["retracted_on"] = on or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rec["reason"] = reason
    rec["superseded_by"] = superseded_by
    return rec


def is_retracted(record: dict) -> bool:
    return bool(record.get("retracted"))
