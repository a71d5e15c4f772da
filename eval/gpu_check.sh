#!/usr/bin/env bash
# The GPU checks as one prepared script, for a lent GPU machine (docs/development.md, "On a lent GPU"): exactness
# by pass and row count, the dev set target-only vs speculative at float16 (batch 1 and 8; static decode and eager),
# the pass budget, the live engine at 16, 64, 128 and 256 sessions (and, with PROFILE_SESS, where its time goes), the
# host ceiling. Each step has its own deadline and leaves its
# results in $OUT as soon as it ends, so a run cut short still returns what it did.
#
#   GPU_DATA=/tmp/gpu OUT=/tmp/out bash eval/gpu_check.sh          # on the GPU machine
#   DEVICE=cpu QUICK=1 OUT=/tmp/out GPU_DATA=.gpu bash eval/gpu_check.sh   # here, a dry run of every command
#
# $GPU_DATA holds model.tar's parts (part_*, model.sha: the embedded whisper-base as float16, lossless), whl/ (the
# pure-Python and manylinux wheels the image lacks) and dev/ (the dev set as FLAC with its manifest).
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
TYPE=${TYPE:-$([ "$DEVICE" = cpu ] && echo float32 || echo float16)}
THREADS=${THREADS:-8}
DATA=$(cd "${GPU_DATA:-/tmp/gpu}" && pwd)
OUT=${OUT:?set OUT}
REPO=$PWD
WORK=$(mktemp -d)

source eval/gpu_setup.sh
PY="python3"
[ "$DEVICE" = cpu ] && PY="python"
MANIFEST=$DATA/dev/manifest.jsonl
export ASR_SPEC_DEV=$DATA/dev PYTHONUNBUFFERED=1
if [ -n "${QUICK:-}" ]; then LIMIT="--limit 2"; FILES=2; SESS=2; SECS=5; HOST=4; else LIMIT=""; FILES=16; SESS=16,64,128,256; SECS=20; HOST=16,64; fi

[ -z "${SKIP_EXACT:-}" ] && step 45 $PY eval/experiments/exact_rows.py --device "$DEVICE" --compute-type "$TYPE",bfloat16,int8 > "$OUT/exact-rows.txt" 2>&1
# the dev set with each static mode (STATIC_MODES="" skips it) (ASR_SPEC_STATIC: auto = the static decode replayed as CUDA graphs on CUDA; off =
# the eager loop), side by side in one run; BATCHES_<mode> gives a mode's batch sizes
for mode in ${STATIC_MODES-auto}; do
  batches_var="BATCHES_$mode"
  (cd "$WORK" && ASR_SPEC_STATIC=$mode step "${EVAL_SECS:-150}" $PY -m asr_spec eval --manifest "$MANIFEST" $LIMIT \
    --device "$DEVICE" --compute-type "$TYPE" --systems "${SYSTEMS:-target,spec}" --batch-size "${!batches_var:-1,8}" \
    --threads "$THREADS" --out "$WORK/eval-$mode")
  cp "$WORK/eval-$mode/results.json" "$OUT/eval-$TYPE-static-$mode.json" 2>/dev/null
done
# the live engine (its steps static on CUDA since issue 48: ASR_SPEC_STATIC=auto; STREAM_MODES="auto off" compares;
# STREAM_SESS_<mode> and STREAM_LIMIT_<mode> give a mode's session counts and deadline; each count's row is in streaming-static-<mode>.log as it ends)
# STREAM_WINDOWS="full stream" compares serve's encoder windows (ASR_SPEC_ENCODER_WINDOW; auto: serve's, full on CUDA)
for win in ${STREAM_WINDOWS:-auto}; do
for mode in ${STREAM_MODES:-auto}; do
  tag=$mode$([ "$win" = auto ] || echo "-$win")
  [ -z "${SKIP_STREAMING:-}" ] && ASR_SPEC_ENCODER_WINDOW=$win ASR_SPEC_STATIC=$mode step "$(v="STREAM_LIMIT_$mode"; echo "${!v:-${STREAM_SECS_LIMIT:-300}}")" $PY eval/bench_streaming.py \
    --device "$DEVICE" --compute-type "$TYPE" --seconds "${STREAM_SECONDS:-$SECS}" --skip-wer --sessions "$(v="STREAM_SESS_$mode"; echo "${!v:-${STREAM_SESS:-$SESS}}")" \
    --threads "$THREADS" --out "$WORK/streaming-$tag" 2>&1 | tee "$OUT/streaming-static-$tag.log"
  cp "$WORK/streaming-$tag"*/results.json "$OUT/streaming-static-$tag.json" 2>/dev/null  # -TYPE ends the folder
done
done
# where the live engine's time goes at a count (PROFILE_SESS=64: engine time by part, no cProfile: under cProfile 64
# streams did not finish in 110 s on an H200 host); PROFILE_DRAFTS="on off" also runs it with serve --no-stream-draft
for n in ${PROFILE_SESS:-}; do
for d in ${PROFILE_DRAFTS:-on}; do
  ASR_SPEC_STATIC=${PROFILE_MODE:-auto} step "${PROFILE_LIMIT:-120}" $PY eval/experiments/profile_stream.py --device "$DEVICE" \
    --compute-type "$TYPE" --sessions "$n" --seconds "${STREAM_SECONDS:-$SECS}" --threads "$THREADS" --no-cprofile \
    $([ "$d" = off ] && echo --no-stream-draft) > "$OUT/profile-stream-$n$([ "$d" = off ] && echo -hints-only).txt" 2>&1
done
done
[ -z "${SKIP_BUDGET:-}" ] && step 60 $PY eval/pass_budget.py --device "$DEVICE" --compute-type "$TYPE" --files "$FILES" --systems target,spec \
  --threads "$THREADS" --manifest "$MANIFEST" --out "$OUT/pass-budget.json"
[ -z "${SKIP_HOST:-}" ] && step 70 $PY eval/host_ceiling.py --device "$DEVICE" --sessions "$HOST" --seconds 20 --threads "$THREADS" \
  --out "$OUT/host-ceiling.json"
log done
