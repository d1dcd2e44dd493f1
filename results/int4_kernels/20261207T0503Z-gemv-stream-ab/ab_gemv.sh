#!/bin/bash
# Alternate the int4 weight-stream benchmark between trees: ab_gemv.sh OUT ROUNDS SHAPE TREE...
# Each tree builds its own kernels (its own VLLM_OMNI_CACHE); the benchmark's JSON per run goes
# to OUT/<tree name>/.
set -e
out=$1; rounds=$2; shape=$3; shift 3
for r in $(seq "$rounds"); do
  for tree in "$@"; do
    name=$(basename "$tree")
    (cd "$tree" && VLLM_OMNI_CACHE=/tmp/s29/cache-$name PYTHONPATH="$tree" \
      /work/main/.venv/bin/python -m omni_ray.bench.int4_kernels --shape "$shape" --passes 9 \
      --no-crossover --out "$out/$name/" | grep -E "^(native-amx|native-avx512)")
    echo "round $r $name done"
  done
done
