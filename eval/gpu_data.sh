#!/usr/bin/env bash
# What eval/gpu_check.sh needs on a lent GPU machine (which reaches nothing outside it), made here into a folder that
# .git/info/exclude ignores (default .gpu): the embedded whisper-base as float16 (lossless: its CTranslate2 source is
# float16) in a tar cut in 27 MB parts with its sha256, the wheels the machine's image lacks (whl/), the embedded
# tokenizer (tok/, for the tiny model) and the dev set as FLAC with its manifest (dev/). docs/development.md, "On a lent
# GPU", says how the parts travel (two a call, with carry) before the call that runs the checks. With TRAIN=1 also
# train/ for eval/gpu_distill.sh: the unlabeled training audio as Opus (~18 kb/s: 3.3 h in 30 MB; the target labels
# what it hears in it) in one tar, the text corpus gzipped, and tts/: TTS_CLIPS clips (default 1500, ~45 MB)
# synthesized here from that corpus as `asr_spec distill` synthesizes them (the lent machine has no TTS engine), as
# Opus (TRAIN_DIR: default ../shared/data/train; TRAIN_LIMIT=N: the first N clips, for a dry run).
#
#   [TRAIN=1] bash eval/gpu_data.sh [.gpu]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpu}
grep -qx "/$OUT/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info && echo "/$OUT/" >> .git/info/exclude; }
rm -rf "$OUT" && mkdir -p "$OUT/whl" "$OUT/tok" "$OUT/dev"
WORK=$(mktemp -d)
python - "$WORK/model" "$OUT" <<'PY'
import json, os, shutil, sys
import soundfile as sf
import torch
from safetensors.torch import load_file, save_file
from asr_spec.evaluation.data import dev_dir
from asr_spec.models.loader import EMBEDDED, resolve
work, out = sys.argv[1:3]
src = str(resolve(EMBEDDED))  # the embedded whisper-base, converted into the cache on first use
os.makedirs(work)
weights = load_file(os.path.join(src, "model.safetensors"))
half = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
assert all(torch.equal(half[k].to(v.dtype), v) for k, v in weights.items()), "not lossless as float16"
save_file({k: v.contiguous() for k, v in half.items()}, os.path.join(work, "model.safetensors"), metadata={"format": "pt"})
for name in ("config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json"):
    shutil.copy(os.path.join(src, name), work)
shutil.copy(os.path.join(src, "tokenizer.json"), os.path.join(out, "tok"))
dev, rows = dev_dir(), []
for line in open(dev / "manifest.jsonl"):
    r = json.loads(line)
    audio, rate = sf.read(dev / r["audio"], dtype="int16")
    r["audio"] = os.path.splitext(r["audio"])[0] + ".flac"
    sf.write(os.path.join(out, "dev", r["audio"]), audio, rate, format="FLAC")
    rows.append(json.dumps(r) + "\n")
open(os.path.join(out, "dev", "manifest.jsonl"), "w").writelines(rows)
PY
(cd "$WORK" && tar cf model.tar model && sha256sum model.tar > model.sha)
split -b 27M -d "$WORK/model.tar" "$OUT/part_" && cp "$WORK/model.sha" "$OUT/" && rm -rf "$WORK"
# the image's Python is 3.12; each package pinned to the version this checkout's environment runs
pins=$(python -m pip list --format=freeze 2>/dev/null | grep -i -E '^(soundfile|soxr|websockets|starlette|uvicorn|python.multipart|pydantic|pydantic.core|pydantic.settings|typing.inspection|annotated.types|python.dotenv|silero.vad|sounddevice|cffi|pycparser|jiwer|rapidfuzz|whisper.normalizer|more.itertools)==')
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $(for n in 28 27 24 17 5; do echo --platform manylinux_2_${n}_x86_64; done) --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$OUT/whl" $pins
if [ -n "${TRAIN:-}" ]; then
  WORK=$(mktemp -d) TRAIN_DIR=$(cd "${TRAIN_DIR:-../shared/data/train}" && pwd)
  mkdir -p "$WORK/audio" "$OUT/train/text"
  python - "$TRAIN_DIR/audio" "$WORK/audio" "${TRAIN_LIMIT:-0}" <<'PY'
import os, sys
from concurrent.futures import ProcessPoolExecutor
import soundfile as sf
from asr_spec.distill.data import audio_files
src, out, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = audio_files([src])[: limit or None]
def opus(f):
    dst = os.path.join(out, os.path.splitext(os.path.relpath(f, src))[0] + ".ogg")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    audio, rate = sf.read(f, dtype="float32")
    sf.write(dst, audio, rate, format="OGG", subtype="OPUS", compression_level=0.95)
with ProcessPoolExecutor(os.cpu_count()) as pool:
    list(pool.map(opus, files, chunksize=16))
PY
  tar cf "$OUT/train/audio.tar" -C "$WORK" audio
  mkdir -p "$OUT/tts" && python - "$TRAIN_DIR/text" "$WORK" "${TTS_CLIPS:-1500}" <<'PY'
import os, sys
from pathlib import Path
import soundfile as sf
from asr_spec.audio import SAMPLE_RATE, load_audio
from asr_spec.distill.data import synthesize
from asr_spec.distill.tts import available_engines
text, work, count = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
os.makedirs(work / "tts", exist_ok=True)
for wav in synthesize(sorted(text.glob("*.txt")), count, work / "wav", available_engines(), seed=0):
    sf.write(work / "tts" / (wav.stem + ".ogg"), load_audio(wav), SAMPLE_RATE, format="OGG", subtype="OPUS",
             compression_level=0.95)  # at 16 kHz: the engines' 22,050 Hz is not a rate Opus takes
PY
  tar cf "$OUT/tts/tts.tar" -C "$WORK" tts
  for f in "$TRAIN_DIR"/text/*.txt; do
    gzip -9c "$f" > "$OUT/train/text/$(basename "$f").gz"
  done
  rm -rf "$WORK"
fi
ls "$OUT" && du -sh "$OUT"/*
