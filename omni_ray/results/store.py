"""Atomic result files: write to a temporary file in the same directory, fsync, ``os.replace``.

A reader never sees half a file, and a crash mid-write leaves the old file (or none), never a
truncated one. Reading a corrupt file is a ``UserError`` naming the file and the position.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from omni_ray.errors import UserError

# A run directory's subdirectory of each arm pass's request, log and runner answer
# (``<arm>.pN.request.json``, ``.log``, ``.result.json``); the records sit beside it.
LOGS_DIR = "logs"


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, creating parent directories."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (best effort: not every filesystem allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def to_json(obj: Any) -> str:
    """The JSON text result files use: indented, keys in insertion order, trailing newline.

    Non-finite floats are refused (they are not JSON), so a NaN cannot slip into a result."""
    return json.dumps(obj, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Serialise ``obj`` first (so a bad value leaves no file), then write atomically."""
    try:
        text = to_json(obj)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: cannot write as JSON: {e}") from e
    return write_text_atomic(path, text)


def read_json(path: str | os.PathLike) -> Any:
    """Load a JSON file; a missing or corrupt file is a one-line ``UserError`` naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such result file") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: corrupt JSON at line {e.lineno} column {e.colno}: {e.msg}") \
            from None
