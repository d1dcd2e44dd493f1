"""Benchmarks that compare engines side by side in one run (``python -m omni_ray.bench.<name>``).

Each benchmark orchestrates fresh engine processes through ``omni_ray.engine.launch`` and peers
through ``omni_ray.peers``; only the in-process helpers it starts as children import vLLM.
"""
