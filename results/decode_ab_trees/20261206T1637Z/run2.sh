#!/bin/bash
for round in 1 2; do for tree in wt-old wt-a main; do
  (cd /work/$tree && PYTHONPATH=/work/$tree /work/main/.venv/bin/omni-ray sweep --busy-wait 300 --no-report --out /tmp/lead/dab/o2-$tree /tmp/lead/dab/c2.yaml > /tmp/lead/dab/b-$tree-$round.log 2>&1)
  grep -E "decode [0-9.]+ tok/s" /tmp/lead/dab/b-$tree-$round.log | sed -E "s/.*(decode [0-9.]+ tok\/s).*/$tree r$round \1/"
done; done
