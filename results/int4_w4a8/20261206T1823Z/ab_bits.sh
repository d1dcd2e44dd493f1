#!/bin/bash
# W4A16 (cpu_int4) against W4A8 (cpu_int4_a8) and bf16 F.linear, one tree, alternating twice
SH=1152x896,896x896,9728x896,896x4864,2560x2048,2048x2048,22016x2048,2048x11008
for round in 1 2; do
  for bits in 16 8; do
    echo "== activation bits $bits round $round"
    VLLM_OMNI_CACHE=/tmp/a8cache .venv/bin/python -m vllm_omni.ops.int4_bench --shapes $SH --rows 1,128,512 --repeats 7 --activation-bits $bits | tail -26
  done
done
