"""Distillation data: audio clips (real files and synthesized speech), labelled by the target itself —
its encoder output, greedy pseudo-labels and top-k log-probabilities — computed once and cached."""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from ..audio import SAMPLE_RATE, AudioError, load_audio
from ..decoding.rows import SAMPLE_LEN, RowRequest, RowResult
from ..features import HOP, N_SAMPLES, WindowPadding, log_mel, window
from ..models.loader import Whisper
from ..models.pair import Pair
from ..recognizer import Checks, Recognizer, compression_ratio, nothing_said, pad_memories
from ..transcribe import TranscribeOptions, Transcriber
from .augment import augment
from .tts import passages, random_voice, speak

AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".mp3"}
CHECKS = Checks()  # Whisper's thresholds: labels that fail them teach the draft nothing


@dataclass
class Example:
    id: str
    # "real", "aug" (a real clip augmented), "tts", "session" (a window of real clips joined and decoded as
    # ``transcribe`` does) or "policy" (on the draft's own path: onpolicy.py)
    source: str
    memory: torch.Tensor  # target encoder output, fp16 [frames, d_model]
    prompt: list[int]
    labels: list[int]  # the target's greedy tokens, end-of-text included
    top_ids: torch.Tensor  # [len(labels), k] int32: the target's k most likely tokens at each label position
    top_logprobs: torch.Tensor  # [len(labels), k] fp16
    inputs: list[int] | None = None  # the tokens fed after the prompt (None: labels[:-1], teacher forcing; on-policy
    # examples feed the draft's own tokens, each label the target's choice after them)

    @property
    def held_aside(self) -> bool:
        return held_aside(self.id)


def held_aside(example_id: str) -> bool:
    """About 1 in 16 examples, chosen by id, measure held-aside acceptance during training (a real clip's first
    window: ``"{file stem}@0"``)."""
    return hashlib.sha1(example_id.encode()).digest()[0] % 16 == 0


def audio_files(dirs: list[Path]) -> list[Path]:
    files = []
    for d in dirs:
        files += [p for p in sorted(Path(d).rglob("*")) if p.suffix.lower() in AUDIO_SUFFIXES]
    return files


def synthesize(text_files: list[Path], count: int, out_dir: Path, engines: list[str], seed: int) -> list[Path]:
    """``count`` synthesized clips (cached in ``out_dir``: existing ones are kept). Clip i's text and voice do not
    depend on ``count``, so a longer run extends a shorter one's clips."""
    rng = random.Random(seed)
    sentences = [s.strip() for f in text_files for s in Path(f).read_text().splitlines() if len(s.strip()) > 3]
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, text in enumerate(passages(sentences, count, rng)):
        voice = random_voice(random.Random(f"{seed}:{i}"), engines)  # clip i's voice whatever the count
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


def augmented(items: list[tuple[str, str, np.ndarray]], copies: int, seed: int) -> list[tuple[str, str, np.ndarray]]:
    """``copies`` augmented copies of every clip (augment.py: speed, noise, reverberation, telephone band), each
    chosen by the clip's id and the copy's number (the same on a rerun)."""
    out = []
    for cid, _, audio in items:
        for n in range(copies):
            kind, changed = augment(audio, random.Random(f"{seed}/{cid}/{n}"))
            out.append((f"{cid}~{kind}{n}", "aug", changed))
    return out


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


def sessions(files: list[Path], seconds: float) -> list[tuple[str, np.ndarray]]:
    """Clips joined into recordings of up to ``seconds``, as ``transcribe`` meets long audio: consecutive files of
    one folder (one language) with 0.5 s of silence between them, so every window after a recording's first is
    prompted with the text before it."""
    gap = np.zeros(SAMPLE_RATE // 2, np.float32)
    groups: dict[Path, list[Path]] = {}
    for f in files:
        groups.setdefault(f.parent, []).append(f)
    out: list[tuple[str, np.ndarray]] = []
    for group in groups.values():
        pieces: list[np.ndarray] = []
        for f in group:
            try:
                audio = load_audio(f)
            except AudioError:
                continue
            if pieces and sum(map(len, pieces)) + len(audio) > seconds * SAMPLE_RATE:
                out.append((f"{group[0].stem}+{len(out)}", np.concatenate(pieces)))
                pieces = []
            pieces += [audio, gap]
        if pieces:
            out.append((f"{group[0].stem}+{len(out)}", np.concatenate(pieces)))
    return out


class _Recorder(Transcriber):
    """``transcribe``'s own window loop (target only) that keeps every greedy window decode: the window's encoder
    output, its prompt (previous text, timestamps) and the target's tokens."""

    def __init__(self, target: Whisper):
        super().__init__(target)
        self.windows: list[tuple[torch.Tensor, list[int], RowResult]] = []

    def decoded(self, memory: torch.Tensor, request: RowRequest, result: RowResult, temperature: float) -> None:
        if temperature == 0.0:
            self.windows.append((memory.clone(), request.prompt, result))


def label_sessions(target: Whisper, recordings: list[tuple[str, np.ndarray]], top_k: int,
                   batch_size: int = 8, padding: str = "audio") -> list[Example]:
    """Label recordings window by window as ``transcribe`` decodes them (prompted with the previous text,
    timestamps, seeking, windows padded as ``padding`` says), ``batch_size`` recordings in flight."""
    rec = _Recorder(target)
    for _ in rec.transcribe_many([(name, lambda a=a: a) for name, a in recordings],
                                 TranscribeOptions(window_padding=padding),
                                 batch_size, use_draft=False):
        pass
    name = recordings[0][0] if recordings else ""
    return _with_top_k(target, [(f"{name}#w{j}", "session", memory, prompt, r)
                                for j, (memory, prompt, r) in enumerate(rec.windows)], top_k)


@torch.inference_mode()
def label(target: Whisper, batch: list[tuple[str, str, np.ndarray]], top_k: int, timestamps: bool,
          padding: str = "audio") -> list[Example]:
    """Run the target over a batch of clips (each its first window, padded as ``padding`` says: WindowPadding):
    encoder, language, greedy decode (batched), then top-k log-probs."""
    tr = Recognizer(target)
    v = target.vocab
    mel = torch.stack([window(log_mel(a, target.n_mels), 0) for _, _, a in batch])
    if padding == WindowPadding.MEL:  # zeros after each clip's own frames
        for i, (_, _, a) in enumerate(batch):
            mel[i, :, len(a) // HOP:] = 0.0
    memory = target.encode(mel)
    languages = tr.detect_language(memory) if v.multilingual else [None] * len(batch)
    prompts = [tr.prompt([], lang, "transcribe", timestamps) for lang in languages]
    results = tr.decode(Pair(memory), prompts, 0.0, timestamps, k=0, use_draft=False)
    return _with_top_k(target, [(f"{cid}{'' if timestamps else '#nots'}", source, memory[i], prompts[i].prompt, r)
                                for i, ((cid, source, _), r) in enumerate(zip(batch, results))], top_k)


@torch.inference_mode()
def _with_top_k(target: Whisper, decoded: list[tuple[str, str, torch.Tensor, list[int], RowResult]],
                top_k: int, rows: int = 8) -> list[Example]:
    """Examples from decoded windows (id, source, encoder output [S, D], prompt, result): loops, hallucinations
    and silence are dropped (they teach the draft nothing useful); the target's top-k log-probabilities at each
    label position come from one teacher-forced pass per ``rows`` windows."""
    v, dec = target.vocab, target.decoder
    keep = []
    for cid, source, memory, prompt, r in decoded:
        text = target.tokenizer.decode(r.tokens)
        if (len(r.tokens) >= SAMPLE_LEN - 1 or compression_ratio(text) > CHECKS.compression_ratio_threshold
                or not text.strip() or nothing_said(r)):
            continue
        keep.append((cid, source, memory, prompt, r.tokens + [v.eot]))
    out = []
    for start in range(0, len(keep), rows):
        part = keep[start:start + rows]
        seqs = [prompt + labels[:-1] for _, _, _, prompt, labels in part]
        width = max(map(len, seqs))
        tokens = torch.tensor([q + [v.eot] * (width - len(q)) for q in seqs], device=dec.device)
        memory = pad_memories([m[None].float() for _, _, m, _, _ in part])
        lengths = [m.shape[0] for _, _, m, _, _ in part]
        logits = dec(dec.new_cache(memory, width, lengths if len(set(lengths)) > 1 else None), tokens,
                     torch.arange(width, device=dec.device).expand(len(part), -1))
        for j, (cid, source, m, prompt, labels) in enumerate(part):
            lp = torch.log_softmax(logits[j, len(prompt) - 1: len(prompt) - 1 + len(labels)].float(), dim=-1)
            top = lp.topk(top_k, dim=-1)
            out.append(Example(cid, source, m.to(torch.float16).cpu(), prompt, labels, top.indices.to(torch.int32).cpu(),
                               top.values.to(torch.float16).cpu()))
    return out


Clip = tuple[str, str, np.ndarray]  # (id, source, audio), as clips() yields them


def shard_examples(shard: Path, batch: list[Clip],
                   label_todo: Callable[[list[tuple[int, Clip]]], list[Example]]) -> list[Example]:
    """The examples of ``batch`` from its shard, the clips the shard has not labelled yet labelled by ``label_todo``
    and the shard rewritten. A shard keeps the ids of the clips it labelled (a clip may give no example: a loop,
    silence), so that a run with fewer clips (ending inside a shard) or other ones (a longer run) loses none."""
    data = torch.load(shard, weights_only=False) if shard.exists() else {"ids": [], "examples": []}
    if isinstance(data, list):  # a shard written before the ids were kept: the clips behind its examples
        data = {"ids": sorted({e.id.split("#")[0] for e in data}), "examples": data}
    done = set(data["ids"])
    todo = [(j, b) for j, b in enumerate(batch) if b[0] not in done]
    if todo:
        data = {"ids": data["ids"] + [b[0] for _, b in todo], "examples": data["examples"] + label_todo(todo)}
        torch.save(data, shard.with_suffix(".tmp"))
        shard.with_suffix(".tmp").replace(shard)
    ids = {cid for cid, _, _ in batch}
    return [e for e in data["examples"] if e.id.split("#")[0] in ids]
