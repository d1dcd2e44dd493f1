#!/bin/bash
for round in 1 2; do for tree in wt-old main; do
  (cd /work/$tree && PYTHONPATH=/work/$tree /work/main/.venv/bin/omni-ray sweep --busy-wait 300 --no-report --out /tmp/lead/dab/out-$tree /tmp/lead/dab/c.yaml > /tmp/lead/dab/$tree-$round.log 2>&1)
  grep -E "decode [0-9.]+ tok/s" /tmp/lead/dab/$tree-$round.log | sed -E "s/.*(enforce_eager=[a-z]+).*(decode [0-9.]+ tok\/s).*/$tree r$round \1 \2/"
done; done
