#!/bin/bash
# pass budget at batch 8: the draft's cross-attention masked over the longest memory (prev) vs per row length (now)
for i in 1 2; do
  for label in prev now; do
    if [ $label = prev ]; then pp=/work/prev; else pp=/work/main; fi
    (cd /tmp && PYTHONPATH=$pp /work/main/.venv/bin/python $pp/eval/pass_budget.py --compute-type float32,int8_bfloat16 --files 32 --batch 8 --threads 2 --out /work/bench-join/budget-$label$i.json) > /work/bench-join/budget-$label$i.log 2>&1
  done
done
echo done
