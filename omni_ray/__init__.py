"""omni-ray: patched vLLM CPU engines on every NUMA node, benchmark sweeps measured honestly."""
