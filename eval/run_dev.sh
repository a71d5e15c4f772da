#!/usr/bin/env bash
# The full dev-set comparison, every system side by side in one run per manifest:
#   bash eval/run_dev.sh [extra asr_spec eval options, e.g. --draft DIR --k 3,4,5]
# Needs the eval and peers extras: pip install -e ".[models,eval,peers]"
# Results: eval/results/all-systems/dev/ (65 utterances) and eval/results/all-systems/longform/ (the 237 s file).
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=${ASR_SPEC_DEV:-../shared/data/dev}
SYSTEMS=${SYSTEMS:-target,spec,spec-sample,draft,hf,hf-assisted,faster-whisper}
asr_spec eval --manifest "$DEV/manifest.jsonl" --out eval/results/all-systems/dev --systems "$SYSTEMS" --k "${KS:-3,4}" --draft-stop "${STOPS:-0.3,0}" "$@"
asr_spec eval --manifest "$DEV/longform/manifest.jsonl" --out eval/results/all-systems/longform \
  --systems "${LONG_SYSTEMS:-target,spec,hf,faster-whisper}" --k "${KS:-3,4}" --draft-stop "${STOPS:-0.3,0}" "$@"
