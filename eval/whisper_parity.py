"""asr_spec's text against openai-whisper's own code on the same weights, in each window-padding mode (issue 80).

    python eval/whisper_parity.py [--manifest FILE (default: the dev set's)] [--modes mel,audio] [--beam 1]
                                  [--threads 2] [--out eval/results/openai-whisper/parity.json]

float32, greedy (or ``--beam N``: beam search on both sides), no temperature fallback, English, timestamps. ``mel``: ``asr_spec transcribe --window-padding mel``
against ``whisper.transcribe(model, audio, temperature=0)``, the function openai-whisper's CLI runs. ``audio``:
``--window-padding audio`` against ``whisper.decode(model, log_mel_spectrogram(pad_or_trim(audio)),
temperature=0)`` (one 30 s window: utterances up to 30 s only). Per mode: texts identical, WER of each, and every
utterance whose texts differ.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from asr_spec.decoding.beam import BeamOptions
from asr_spec.evaluation.harness import write_results
from asr_spec.evaluation.metrics import wer
from asr_spec.evaluation.systems import openai_whisper_model
from asr_spec.features import WindowPadding
from asr_spec.models.loader import ModelOptions, load
from asr_spec.recognizer import Checks
from asr_spec.transcribe import TranscribeOptions, Transcriber

ROOT = Path(__file__).resolve().parents[1]


def theirs(model, audio: np.ndarray, mode: WindowPadding, beam: int) -> str | None:
    import whisper

    beams = {"beam_size": beam} if beam > 1 else {}
    if mode is WindowPadding.MEL:
        return whisper.transcribe(model, audio, language="en", temperature=0.0, fp16=False, **beams)["text"].strip()
    if len(audio) > whisper.audio.N_SAMPLES:
        return None  # decode() reads one window
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(audio), model.dims.n_mels)
    options = whisper.DecodingOptions(language="en", temperature=0.0, fp16=False, **beams)
    return whisper.decode(model, mel, options).text.strip()


def main() -> None:
    import torch

    from asr_spec.evaluation.data import DataSet, dev_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--manifest", type=Path, default=None, help="a manifest (default: the dev set's)")
    p.add_argument("--modes", default="mel,audio")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--beam", type=int, default=1, help="beams of a beam search on both sides (1: greedy)")
    p.add_argument("--out", type=Path, default=ROOT / "eval/results/openai-whisper/parity.json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    a.manifest = a.manifest or dev_dir() / "manifest.jsonl"
    data = DataSet.read(a.manifest)
    target, draft = load(ModelOptions(threads=a.threads, measure_now=False))
    tr = Transcriber(target, draft)
    model = openai_whisper_model("whisper-base")
    out = {}
    for mode in map(WindowPadding, a.modes.split(",")):
        options = TranscribeOptions(language="en", checks=Checks((0.0,)), window_padding=mode,
                                    beam=BeamOptions(a.beam) if a.beam > 1 else None)
        rows = []
        for it in data.items:
            audio = data.audio(it)
            mine = tr.transcribe(audio, options).text.strip()
            rows.append({"id": it["id"], "ref": it["text"], "asr_spec": mine,
                         "openai_whisper": theirs(model, audio, mode, a.beam)})
            print(f"{mode} {it['id']}: {'same' if rows[-1]['openai_whisper'] == mine else 'DIFFERENT'}", flush=True)
        compared = [r for r in rows if r["openai_whisper"] is not None]
        out[str(mode)] = {
            "compared": len(compared), "identical": sum(r["asr_spec"] == r["openai_whisper"] for r in compared),
            "wer_asr_spec": round(wer([r["ref"] for r in rows], [r["asr_spec"] for r in rows]), 2),
            "wer_openai_whisper": round(wer([r["ref"] for r in compared], [r["openai_whisper"] for r in compared]), 2),
            "different": [r for r in compared if r["asr_spec"] != r["openai_whisper"]],
            "texts": {r["id"]: r["asr_spec"] for r in rows}}
        print(f"{mode}: {out[str(mode)]['identical']}/{len(compared)} identical; WER asr_spec "
              f"{out[str(mode)]['wer_asr_spec']} %, openai-whisper {out[str(mode)]['wer_openai_whisper']} %", flush=True)
    if len(out) == 2:
        a_, m_ = out["audio"]["texts"], out["mel"]["texts"]
        print(f"the two paddings give other texts on {sum(a_[i] != m_[i] for i in a_)} of {len(a_)}: "
              + ", ".join(i for i in a_ if a_[i] != m_[i]), flush=True)
    manifest = os.path.relpath(a.manifest.resolve(), ROOT)  # no machine's own folders in a results file
    write_results(a.out, {"manifest": manifest, "beam": a.beam, "modes": out}, a.threads)


if __name__ == "__main__":
    main()
