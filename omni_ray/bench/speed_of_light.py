"""A developer's probe, kept as a name: the speed-of-light arithmetic and the bandwidth probe
now live in ``omni_ray.measure.speed_of_light`` and ``omni_ray.measure.bandwidth`` (a sweep
records them per arm: docs/measurements.md). This module re-exports them for
``omni_ray.bench.int4_peers`` and older notes;
``python -m omni_ray.bench.speed_of_light --cpus 0,1 [--regimes]`` is
``python -m omni_ray.measure.bandwidth``.
"""

from __future__ import annotations

from omni_ray.measure.bandwidth import main, measure_bandwidth, measure_regimes  # noqa: F401
from omni_ray.measure.speed_of_light import (  # noqa: F401
    CACHE_PROBE_LLC_DIVISOR, DRAM_PROBE_LLC_MULTIPLE, DRAM_PROBE_MIN_BYTES, GiB, MiB,
    bytes_per_token, fraction, int4_linear_bytes, linear_shapes, norm_params, percent_text,
    probe_name, probe_sizes, regime_bound)

if __name__ == "__main__":
    raise SystemExit(main())
