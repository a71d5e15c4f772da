#!/usr/bin/env bash
# Issue 49 on a lent GPU: the target labels the training audio and the draft trains there, in one call of BUDGET_S
# seconds (docs/development.md, "On a lent GPU"). First the labels (`asr_spec distill` with a few seconds of training
# fills its work folder's cache), then the rest of the budget trains the same run on: it resumes the checkpoint with the
# minutes left as its whole budget, so the learning rate decays to their end (less RELOAD_S: before training it
# decodes the audio again and reads the labels back). The draft comes back in $OUT in 15 MB parts (`cat
# draft.safetensors.part_* > draft.safetensors`) and draft-meta.tar: its metadata, report and card, the labelling
# run's report (label-report.json: its label_seconds is the labelling's time), the log and, where $GPU_DATA has dev/
# (gpu_data.sh makes it), the draft's acceptance on the dev set there (dev-spec.json: `asr_spec eval --systems spec
# --speculation on`, float32; DEV_S reserves its time).
#
#   GPU_DATA=/tmp/gpu OUT=/tmp/out BUDGET_S=500 bash eval/gpu_distill.sh          # on the GPU machine
#   DEVICE=cpu GPU_DATA=.gpu-quick OUT=DIR BUDGET_S=150 MARGIN_S=30 RELOAD_S=10 bash eval/gpu_distill.sh
#                                # here: a dry run of the distill commands (gpu_setup.sh does nothing on a CPU)
#
# $GPU_DATA: what `TRAIN=1 bash eval/gpu_data.sh` makes (the model's parts, whl/, train/audio.tar, train/text/*.gz,
# tts/tts.tar: clips synthesized there from the corpus, labelled here as `--tts-audio`). DISTILL_ARGS replaces the
# training options (default: a fresh draft with 16,384 text tokens, batches of 64, the target labelling 32 clips at a
# time; add e.g. --augment 1 where the budget allows). ALSO_ARGS (e.g. "--on-policy 0.25"): a second run beside the
# first on the same labels (its own work folder, the label cache hard-linked), trained at the same time on the same
# GPU with those options added; it comes back as draft-b.safetensors.part_* and draft-b/ in draft-meta.tar.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
DEVICE=${DEVICE:-cuda}
BUDGET_S=${BUDGET_S:-480}
MARGIN_S=${MARGIN_S:-60}  # after training: the last held-aside measure, the draft written, the parts cut
RELOAD_S=${RELOAD_S:-150}  # the training run's start: 3.3 h of audio decoded and augmented again, ~9 GB of labels read
DEV_S=${DEV_S:-90}
DATA=$(cd "${GPU_DATA:-/tmp/gpu}" && pwd)
[ -f "$DATA/dev/manifest.jsonl" ] || DEV_S=0
OUT=${OUT:?set OUT}
REPO=$PWD
WORK=$(mktemp -d)
source eval/gpu_setup.sh
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15
PY=python3
[ "$DEVICE" = cpu ] && PY=python
mkdir -p "$WORK/text" && tar xf "$DATA/train/audio.tar" -C "$WORK" || exit 6
for f in "$DATA"/train/text/*.gz; do gunzip -c "$f" > "$WORK/text/$(basename "$f" .gz)"; done
TTS=(--tts-clips 0)
[ -f "$DATA/tts/tts.tar" ] && tar xf "$DATA/tts/tts.tar" -C "$WORK" && TTS=(--tts-audio "$WORK/tts" --tts-clips 100000)
OPTIONS=${DISTILL_ARGS:-"--head-size 16384 --batch 64 --label-batch 32 --checkpoint-every 200"}
# shellcheck disable=SC2206  # the options are words
ARGS=(--target whisper-base --audio "$WORK/audio" --text "$WORK"/text/*.txt "${TTS[@]}" --device "$DEVICE"
      $OPTIONS)
step $((START + BUDGET_S - $(date +%s))) $PY -m asr_spec distill "${ARGS[@]}" --work "$WORK/work" --minutes 0.05 --out "$WORK/labelled" \
  >> "$OUT/distill.log" 2>&1
META=$WORK/meta
mkdir -p "$META" && cp "$WORK/labelled/report.json" "$META/label-report.json" 2>/dev/null
LEFT=$((START + BUDGET_S - $(date +%s) - MARGIN_S - DEV_S))
log "labelled; $LEFT s left, $((LEFT - RELOAD_S)) of them to train"
DRAFT=$WORK/labelled
train() {  # train NAME [extra options]: the labelled run trained on in $WORK/NAME (its own work folder unless "draft")
  local name=$1 work=$WORK/work; shift
  if [ "$name" != draft ]; then
    mkdir -p "$WORK/work-$name" && for c in "$WORK"/work/cache*; do cp -al "$c" "$WORK/work-$name/"; done
    work=$WORK/work-$name
  fi
  step $((LEFT + MARGIN_S)) $PY -m asr_spec distill "${ARGS[@]}" "$@" --work "$work" \
    --minutes "$(awk "BEGIN { print ($LEFT - $RELOAD_S) / 60 }")" --out "$WORK/$name" >> "$OUT/distill-$name.log" 2>&1
}
if [ $((LEFT - RELOAD_S)) -gt 20 ]; then
  # shellcheck disable=SC2086  # the options are words
  [ -n "${ALSO_ARGS:-}" ] && { train draft-b $ALSO_ARGS & }
  train draft
  wait
  [ -f "$WORK/draft/draft.safetensors" ] && DRAFT=$WORK/draft
fi
cat "$OUT"/distill-*.log >> "$OUT/distill.log" 2>/dev/null && rm -f "$OUT"/distill-*.log
[ -f "$DRAFT/draft.safetensors" ] || { tail -c 3000 "$OUT/distill.log"; log "no draft"; exit 7; }
split -b 15M -d "$DRAFT/draft.safetensors" "$OUT/draft.safetensors.part_"
cp "$DRAFT"/asr_spec_draft.json "$DRAFT"/report.json "$DRAFT"/README.md "$META"/
if [ -f "$WORK/draft-b/draft.safetensors" ]; then
  split -b 15M -d "$WORK/draft-b/draft.safetensors" "$OUT/draft-b.safetensors.part_"
  mkdir -p "$META/draft-b" && cp "$WORK"/draft-b/{asr_spec_draft.json,report.json,README.md} "$META/draft-b/"
fi
if [ "$DEV_S" -gt 0 ]; then
  step "$DEV_S" $PY -m asr_spec eval --manifest "$DATA/dev/manifest.jsonl" --systems spec --speculation on \
    --device "$DEVICE" --compute-type float32 --draft "$DRAFT" --out "$WORK/dev" >> "$OUT/distill.log" 2>&1
  cp "$WORK/dev/results.json" "$META/dev-spec.json" 2>/dev/null
fi
tail -c 2000 "$OUT/distill.log"
mv "$OUT/distill.log" "$META/" && tar cf "$OUT/draft-meta.tar" -C "$META" .
log done
