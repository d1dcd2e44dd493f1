#!/bin/bash
# Engine start with and without the shared modelinfos (git 2a05bf2) on the small shape, old tree
# (cb699cb, a worktree at /work/wt-old) and new tree (/work/main) alternating, three rounds, a
# cpu_int4 arm (eager) and a bf16 arm each. omni-ray's own stage records; figures read by
# summarize.py beside this file.
set -e
D=$(cd $(dirname $0) && pwd)
for round in 1 2 3; do
  for tree in wt-old main; do
    for q in cpu_int4 bf16; do
      args=""; [ $q = cpu_int4 ] && args="--quantization cpu_int4"
      (cd /work/$tree && PYTHONPATH=/work/$tree /work/main/.venv/bin/omni-ray stage --model small $args \
        --kv-cache-mib 128 --max-model-len 512 --prompt-len 128 --output-len 32 --repeats 2 \
        --no-detokenize --out $D/$tree-$q-r$round.json > /dev/null 2>&1)
    done
  done
done
