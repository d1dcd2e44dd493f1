#!/bin/bash
# Alternate the int4 weight-stream benchmark in one tree with and without an env switch:
# ab_env.sh OUT ROUNDS SHAPE TREE VAR
set -e
out=$1; rounds=$2; shape=$3; tree=$4; var=$5
for r in $(seq "$rounds"); do
  for on in 0 1; do
    name=$([ $on = 1 ] && echo "$var" || echo unchanged)
    (cd "$tree" && if [ $on = 1 ]; then export $var=1; fi; VLLM_OMNI_CACHE=/tmp/s30/cache-$(basename $tree) PYTHONPATH="$tree" \
      /work/main/.venv/bin/python -m omni_ray.bench.int4_kernels --shape "$shape" --passes 9 \
      --no-crossover --out "$out/$name/" | grep -E "^(native-amx|native-avx512)")
    echo "round $r $name done"
  done
done
