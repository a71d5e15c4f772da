"""Offline WER and time with the encoder on the window's audio only (``--encoder-window audio``) against
Whisper's padded 30 s window, for several lengths of silence kept after the audio (the shipped choice is
``asr_spec.features.TAIL_FRAMES``). Text-only comparison: target alone, float32 unless a compute type is given.

    python eval/bench_encoder_window.py N_UTTERANCES [COMPUTE_TYPE] [TAIL_FRAMES,...]
"""
import json, sys, time, torch
from pathlib import Path
import asr_spec.features as F
from asr_spec.audio import load_audio
from asr_spec.models.loader import load_target
from asr_spec.transcribe import Transcriber, TranscribeOptions
import jiwer
from whisper_normalizer.english import EnglishTextNormalizer
norm=EnglishTextNormalizer()
torch.set_num_threads(2)
root=Path('../shared/data/dev'); items=[json.loads(l) for l in open(root/'manifest.jsonl')][:int(sys.argv[1])]
items=[i for i in items if 'long' not in i['id']]
tgt=load_target(compute_type=sys.argv[2] if len(sys.argv)>2 else 'float32')
tr=Transcriber(tgt, None)
audios=[load_audio(root/i['audio']) for i in items]
refs=[i['text'] for i in items]
def run(window, pad):
    F.TAIL_FRAMES = pad  # silence kept after the audio (read by encoder_frames at call time)
    t0=time.perf_counter(); out=[tr.transcribe(a, TranscribeOptions(language='en', encoder_window=window)) for a in audios]
    return [o.text for o in out], time.perf_counter()-t0, sum(o.stats.encoder_seconds for o in out)
full, tf, ef = run('full', 0)
w=lambda r,h: 100*jiwer.wer([norm(x) for x in r],[norm(x) for x in h])
print(f"full: wer {w(refs,full):.2f} time {tf:.1f} enc {ef:.1f}")
for pad in (map(int, sys.argv[3].split(',')) if len(sys.argv) > 3 else (0, 50, 100, 200, 300)):
    hyp, t, e = run('audio', pad)
    diff=sum(a!=b for a,b in zip(full,hyp))
    print(f"audio pad {pad}: wer {w(refs,hyp):.2f} vs full {w(full,hyp):.2f} differing {diff}/{len(hyp)} time {t:.1f} enc {e:.1f}", flush=True)
