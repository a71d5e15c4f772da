#!/usr/bin/env bash
# The race the results page's summary shows: every system side by side, one run per workload (the 65 dev clips, the
# 4 dev recordings), as eval/results/peers/ holds it:
#   bash eval/run_dev.sh [extra asr_spec eval options, e.g. --repeat 3 --draft DIR]
# Needs the eval and peers extras: pip install -e ".[models,eval,peers]" (a peer not installed is skipped).
# Results: eval/results/peers/clips/ and eval/results/peers/recordings/ (OUT=DIR writes DIR/clips, DIR/recordings).
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=${ASR_SPEC_DEV:-../shared/data/dev}
OUT=${OUT:-eval/results/peers}
SYSTEMS=${SYSTEMS:-target,spec,target-beam5,faster-whisper-int8,faster-whisper-int8-beam5,whisper.cpp,whisper.cpp-beam5,openai-whisper,openai-whisper-beam5}
asr_spec eval --manifest "$DEV/manifest.jsonl" --systems "$SYSTEMS" --compute-type auto --threads 2 --out "$OUT/clips" "$@"
asr_spec eval --manifest "$DEV/recordings/manifest.jsonl" --systems "$SYSTEMS" --compute-type auto --threads 2 \
  --out "$OUT/recordings" "$@"
