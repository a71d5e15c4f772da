import sys
from faster_whisper import WhisperModel
m = WhisperModel(sys.argv[1], device="cpu", compute_type="int8", cpu_threads=2)
segs, info = m.transcribe(sys.argv[2], beam_size=1, language=None)
print("".join(s.text for s in segs).strip())
