#!/bin/bash
# usage: matrix.sh PY ROOT threads
PY=$1; ROOT=$2; T=$3
cd $ROOT
for shape in "11008 2048" "2048 11008"; do
  for m in 128 512; do
    line="$shape m=$m:"
    line="$line bf16=$(PYTHONPATH=$ROOT $PY /tmp/s31/one.py $T $shape $m 0)"
    for cfg in "0 1048576" "0 0" "8 1048576" "1 1048576" "2 1048576" "3 1048576" "7 1048576"; do
      set -- $cfg
      for bits in 16 8; do
        v=$(OMNI_AMX_SKIP=$1 OMNI_AMX_MC=$2 PYTHONPATH=$ROOT $PY /tmp/s31/one.py $T $shape $m $bits)
        line="$line s$1/mc$2/a$bits=$v"
      done
    done
    echo "$line"
  done
done
