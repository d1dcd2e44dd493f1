"""Live charts of a sweep: a local Prometheus scraping Ray's metrics (``--monitor``).

Imports neither Ray nor vLLM: it reads the service-discovery file Ray writes in its session
directory and runs the ``prometheus`` binary of the host's package manager.
"""

from omni_ray.monitor.prometheus import METRICS, Prometheus, find_prometheus, free_port

__all__ = ["METRICS", "Prometheus", "find_prometheus", "free_port"]
