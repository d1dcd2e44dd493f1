#!/bin/bash
# cpu_int4's GEMM on the amx set against the avx512 set and bf16 F.linear (oneDNN, AMX bf16 here):
# W4A16 and W4A8, layer shapes of Qwen2.5-0.5B and -3B, one tree, alternating twice.
SH=1152x896,896x896,9728x896,896x4864,2560x2048,2048x2048,22016x2048,2048x11008
for round in 1; do
  for set in amx avx512; do
    for bits in 16 8; do
      echo "== set $set activation bits $bits round $round"
      VLLM_OMNI_INT4_ISA=$set VLLM_OMNI_CACHE=${VLLM_OMNI_CACHE:-/tmp/amxcache} .venv/bin/python -m vllm_omni.ops.int4_bench --shapes $SH --rows 1,16,128,512 --repeats 7 --activation-bits $bits | tail -26
    done
  done
done
