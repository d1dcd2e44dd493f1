"""Every environment variable that omni_ray itself reads, with what it does."""

from __future__ import annotations

import os
from pathlib import Path

# Where built models, compile caches and peer builds are kept (default ~/.cache/omni-ray).
OMNI_RAY_CACHE = "OMNI_RAY_CACHE"


def cache_dir() -> Path:
    return Path(os.environ.get(OMNI_RAY_CACHE) or Path.home() / ".cache" / "omni-ray")
