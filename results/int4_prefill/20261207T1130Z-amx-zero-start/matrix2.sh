#!/bin/bash
PY=$1; ROOT=$2; T=$3; shift 3
cd $ROOT
for shape in "11008 2048" "2048 11008"; do
  for m in 128 512; do
    line="$shape m=$m:"
    line="$line bf16=$(PYTHONPATH=$ROOT $PY /tmp/s31/one.py $T $shape $m 0)"
    for cfg in "$@"; do
      for bits in 16 8; do
        v=$(OMNI_AMX_SKIP=$cfg PYTHONPATH=$ROOT $PY /tmp/s31/one.py $T $shape $m $bits)
        line="$line s$cfg/a$bits=$v"
      done
    done
    echo "$line"
  done
done
