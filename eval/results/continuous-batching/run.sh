#!/bin/bash
# before (commit 3e11493: a batch refilled only when every row of its decode has ended) vs after (rows join between passes)
cd /work/main
for i in 1 2; do
  for label in before after; do
    if [ $label = before ]; then pp=/work/before; else pp=/work/main; fi
    (cd /tmp && PYTHONPATH=$pp /work/main/.venv/bin/python -m asr_spec eval --manifest /work/shared/data/dev/manifest.jsonl \
      --systems target,spec --batch-size 8 --compute-type float32 --threads 2 --out /work/bench-join/$label$i) > /work/bench-join/$label$i.log 2>&1
  done
done
echo done
