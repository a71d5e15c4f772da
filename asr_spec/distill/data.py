"""Distillation data: audio clips (real files and synthesized speech), labelled by the target itself —
its encoder output, greedy pseudo-labels and top-k log-probabilities — computed once and cached."""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ..audio import SAMPLE_RATE, AudioError, load_audio
from ..features import N_SAMPLES, log_mel, window
from ..models.loader import Whisper
from ..decoding.speculative import SAMPLE_LEN
from ..recognizer import Checks, Recognizer, compression_ratio, nothing_said
from .tts import passages, random_voice, speak

AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".mp3"}
CHECKS = Checks()  # Whisper's thresholds: labels that fail them teach the draft nothing


@dataclass
class Example:
    id: str
    source: str  # "real" or "tts"
    memory: torch.Tensor  # target encoder output, fp16 [frames, d_model]
    prompt: list[int]
    labels: list[int]  # the target's greedy tokens, end-of-text included
    top_ids: torch.Tensor  # [len(labels), k] int32: the target's k most likely tokens at each label position
    top_logprobs: torch.Tensor  # [len(labels), k] fp16

    @property
    def held_aside(self) -> bool:
        """About 1 in 16 examples, chosen by id, measure held-aside acceptance during training."""
        return hashlib.sha1(self.id.encode()).digest()[0] % 16 == 0


def audio_files(dirs: list[Path]) -> list[Path]:
    files = []
    for d in dirs:
        files += [p for p in sorted(Path(d).rglob("*")) if p.suffix.lower() in AUDIO_SUFFIXES]
    return files


def synthesize(text_files: list[Path], count: int, out_dir: Path, engines: list[str], seed: int) -> list[Path]:
    """``count`` synthesized clips (cached in ``out_dir``: existing ones are kept)."""
    rng = random.Random(seed)
    sentences = [s.strip() for f in text_files for s in Path(f).read_text().splitlines() if len(s.strip()) > 3]
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, text in enumerate(passages(sentences, count, rng)):
        voice = random_voice(rng, engines)
        path = out_dir / f"tts-{i:05d}-{voice.engine}.wav"
        if not path.exists():
            tmp = path.with_suffix(".part.wav")
            try:
                speak(text, voice, tmp)
                tmp.replace(path)
            except Exception:  # noqa: BLE001 - a voice that fails is skipped, not fatal
                tmp.unlink(missing_ok=True)
                continue
        paths.append(path)
    return paths


def clips(files: list[Path], source: str) -> Iterator[tuple[str, str, np.ndarray]]:
    """(id, source, audio) per file; files longer than 30 s are cut into 30 s pieces."""
    for f in files:
        try:
            audio = load_audio(f)
        except AudioError:
            continue
        for start in range(0, len(audio), N_SAMPLES):
            piece = audio[start:start + N_SAMPLES]
            if len(piece) >= SAMPLE_RATE:
                yield f"{f.stem}@{start // SAMPLE_RATE}", source, piece


@torch.inference_mode()
def label(target: Whisper, batch: list[tuple[str, str, np.ndarray]], top_k: int, timestamps: bool) -> list[Example]:
    """Run the target over a batch of clips: encoder, language, greedy decode (batched), then top-k log-probs."""
    tr = Recognizer(target)
    v, dec = target.vocab, target.decoder
    mel = torch.stack([window(log_mel(a, target.n_mels), 0) for _, _, a in batch])
    memory = target.encode(mel)
    languages = tr.detect_language(memory) if v.multilingual else [None] * len(batch)
    prompts = [tr.prompt([], lang, "transcribe", timestamps) for lang in languages]
    results = tr.decode((memory, None), prompts, 0.0, timestamps, k=0, use_draft=False)
    keep = []
    for i, r in enumerate(results):
        text = target.tokenizer.decode(r.tokens)
        if (len(r.tokens) >= SAMPLE_LEN - 1 or compression_ratio(text) > CHECKS.compression_ratio_threshold
                or not text.strip() or nothing_said(r)):
            continue  # loops, hallucinations and silence teach the draft nothing useful
        keep.append((i, prompts[i].prompt, r.tokens + [v.eot]))
    if not keep:
        return []
    seqs = [prompt + labels[:-1] for _, prompt, labels in keep]
    width = max(map(len, seqs))
    tokens = torch.tensor([s + [v.eot] * (width - len(s)) for s in seqs], device=memory.device)
    rows = torch.tensor([i for i, _, _ in keep], device=memory.device)
    logits = dec(dec.new_cache(memory[rows], width), tokens, torch.arange(width, device=memory.device).expand(len(keep), -1))
    out = []
    for j, (i, prompt, labels) in enumerate(keep):
        lp = torch.log_softmax(logits[j, len(prompt) - 1: len(prompt) - 1 + len(labels)].float(), dim=-1)
        top = lp.topk(top_k, dim=-1)
        cid, source, _ = batch[i]
        out.append(Example(f"{cid}{'' if timestamps else '#nots'}", source, memory[i].to(torch.float16).cpu(), prompt,
                           labels, top.indices.to(torch.int32).cpu(), top.values.to(torch.float16).cpu()))
    return out
