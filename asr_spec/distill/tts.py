"""Offline speech synthesis (Debian's espeak-ng, flite, festival) of text sentences, for distillation data:
many voices and rates, clips of a few sentences each."""
from __future__ import annotations

import functools
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ESPEAK_VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan", "en-us-nyc"]
ESPEAK_VARIANTS = ["", "+m1", "+m3", "+m5", "+m7", "+f1", "+f2", "+f4", "+klatt2"]
FLITE_VOICES = ["slt", "rms", "awb", "kal16"]
FESTIVAL_DIR = Path("/usr/share/festival/voices")  # Debian's festvox-* packages: english/kal_diphone, the HTS
FESTIVAL_ENGLISH = ("english", "us", "british")  # voice us/cmu_us_slt_arctic_hts (festvox-us-slt-hts), ...


@dataclass(frozen=True)
class Voice:
    engine: str
    name: str
    rate: float  # speed factor around the engine's default


def available_engines() -> list[str]:
    found = {"espeak-ng": "espeak-ng", "flite": "flite", "festival": "text2wave"}
    return [e for e, exe in found.items() if shutil.which(exe)]


@functools.cache
def festival_voices(folder: Path = FESTIVAL_DIR) -> list[str]:
    """The English festival voices installed (kal_diphone, festival's default, when none is found)."""
    found = sorted(p.name for kind in FESTIVAL_ENGLISH for p in (folder / kind).glob("*") if p.is_dir())
    return found or ["kal_diphone"]


def random_voice(rng: random.Random, engines: list[str]) -> Voice:
    engine = rng.choice(engines)
    if engine == "espeak-ng":
        return Voice(engine, rng.choice(ESPEAK_VOICES) + rng.choice(ESPEAK_VARIANTS), rng.uniform(0.8, 1.25))
    if engine == "flite":
        return Voice(engine, rng.choice(FLITE_VOICES), rng.uniform(0.85, 1.2))
    voices = festival_voices()  # one voice: the draws of the clips made before other voices were added
    name = voices[0] if len(voices) == 1 else rng.choice(voices)
    return Voice(engine, name, rng.uniform(0.85, 1.15))


def speak(text: str, voice: Voice, out: Path) -> None:
    """Synthesize ``text`` with ``voice`` into the wav file ``out``."""
    if voice.engine == "espeak-ng":
        cmd = ["espeak-ng", "-v", voice.name, "-s", str(int(165 * voice.rate)), "-w", str(out), text]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    elif voice.engine == "flite":
        stretch = f"{1 / voice.rate:.2f}"
        cmd = ["flite", "-voice", voice.name, "--setf", f"duration_stretch={stretch}", "-t", text, "-o", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    else:
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(text)
            f.flush()
            scheme = f"(begin (voice_{voice.name}) (Parameter.set 'Duration_Stretch {1 / voice.rate:.2f}))"
            subprocess.run(["text2wave", "-o", str(out), "-eval", scheme, f.name], check=True, capture_output=True,
                           timeout=300)


def passages(sentences: list[str], count: int, rng: random.Random, min_chars: int = 60,
             max_chars: int = 330) -> list[str]:
    """``count`` runs of consecutive sentences, each between about min_chars and max_chars long."""
    out = []
    while len(out) < count and sentences:
        i = rng.randrange(len(sentences))
        want = rng.randint(min_chars, max_chars)
        text = ""
        while i < len(sentences) and len(text) < want:
            nxt = (text + " " + sentences[i]).strip()
            if len(nxt) > max_chars and text:
                break
            text = nxt
            i += 1
        if len(text) >= 20:
            out.append(text[:max_chars])
    return out
