#!/bin/bash
# old = /work/main (cb699cb), new = /work/wt-gemm; alternating, same shapes
SH=1152x896,896x896,9728x896,896x4864,2560x2048,2048x2048,22016x2048,2048x11008
for round in 1 2; do
  for tree in main wt-chunk; do
    echo "== $tree round $round"
    cache=/tmp/lead/vocache-$tree
    (cd /work/$tree && VLLM_OMNI_CACHE=$cache PYTHONPATH=/work/$tree /work/main/.venv/bin/python -m vllm_omni.ops.int4_bench --shapes $SH --rows 128,512 --repeats 7 | tail -18)
  done
done
