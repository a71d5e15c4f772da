"""The yardstick of first contact: faster-whisper int8 transcribing one file with the embedded model's CTranslate2
weights, as a user's script would (usage: python faster_whisper_sample.py CT2_DIR AUDIO)."""
import sys

from faster_whisper import WhisperModel

model = WhisperModel(sys.argv[1], device="cpu", compute_type="int8", cpu_threads=2)
segments, _ = model.transcribe(sys.argv[2], beam_size=1, language=None)
print("".join(s.text for s in segments).strip())
