"""omni-ray: patched vLLM CPU engines on every NUMA node, benchmark sweeps measured honestly."""

from __future__ import annotations

__all__ = ["run_sweep", "load_sweep", "SweepReport", "run_stage", "doctor"]


def __getattr__(name: str):
    # Lazy, so `import omni_ray` (and the CLI's --help) does not import Ray.
    if name in __all__:
        from omni_ray import api

        return getattr(api, name)
    raise AttributeError(name)
