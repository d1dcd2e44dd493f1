#!/bin/bash
# The 8B GGUF's two steps again, with the build records (time, peak RSS) the change adds.
set -e
M=/root/.cache/omni-ray/models/llama-3.1-8b-full-vocab-seed0-untied-v2
cd /work/wt-amx
PYTHONPATH=/work/wt-amx /work/main/.venv/bin/python -m omni_ray.peers.llamacpp convert "$M" /tmp/s29/g8/model-bf16.gguf --outtype bf16
PYTHONPATH=/work/wt-amx /work/main/.venv/bin/python -m omni_ray.peers.llamacpp quantize /tmp/s29/g8/model-bf16.gguf /tmp/s29/g8/model-bf16-Q4_0.gguf --type Q4_0
