"""Whisper's transcription loop over 30 s windows (openai/whisper ``transcribe``): language detection,
timestamped segments, seeking, prompting with previous text, temperature fallback. Every window is
decoded by the speculative decoder (or target-only when there is no draft)."""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import torch

from .audio import SAMPLE_RATE
from .decoding.costs import CostModel
from .decoding.logits import LogitRules
from .decoding.sampling import Sampler
from .decoding.speculative import DecodeOptions, Decoders, Request, RowResult, RowStats, speculative_decode
from .features import FRAMES_PER_SECOND, N_FRAMES, TOKEN_SECONDS, encoder_frames, log_mel, window
from .models.loader import Draft, Whisper


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None  # None: detect (multilingual models)
    task: str = "transcribe"
    timestamps: bool = True
    k: int = 3  # most drafted tokens per target pass
    draft_stop: float = 0.3  # stop drafting when the draft's belief in its proposal falls below this
    adaptive_k: bool = True  # greedy: each pass drafts the 0..k tokens measured to pay most (False: always k)
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # fallback ladder (temperature_ladder())
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    seed: int = 0
    encoder_window: str = "full"  # "full": Whisper's padded 30 s window; "audio": only the window's audio (faster)


@dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


@dataclass
class Stats:
    audio_seconds: float = 0.0
    encoder_seconds: float = 0.0
    decode_seconds: float = 0.0
    windows: int = 0
    fallbacks: int = 0
    decode: RowStats = field(default_factory=RowStats)

    def as_dict(self) -> dict:
        d = self.decode
        passes = d.target_passes
        return {
            "audio_seconds": round(self.audio_seconds, 3),
            "encoder_seconds": round(self.encoder_seconds, 3),
            "decode_seconds": round(self.decode_seconds, 3),
            "windows": self.windows,
            "fallbacks": self.fallbacks,
            "tokens": d.tokens,
            "target_passes": passes,
            "drafted": d.drafted,
            "accepted": d.accepted,
            "rejected": d.rejected,
            "acceptance": round(d.acceptance, 4),
            "tokens_per_pass": round((d.accepted + passes) / passes, 3) if passes else 0.0,
        }


@dataclass
class Transcript:
    text: str
    segments: list[Segment]
    language: str | None
    stats: Stats


def temperature_ladder(start: float = 0.0, fallback: bool = True) -> tuple[float, ...]:
    """Whisper's temperatures: ``start``, then up by 0.2 to 1.0 when a decode fails its checks."""
    if not fallback:
        return (start,)
    steps = [round(start + 0.2 * i, 2) for i in range(6)]
    return tuple(t for t in steps if t <= 1.0 + 1e-9) or (start,)


def nothing_said(r: RowResult, o: TranscribeOptions = TranscribeOptions()) -> bool:
    """Whisper's no-speech rule: a window is skipped when its no-speech probability is above the threshold,
    unless its text is likely (mean log-probability above that threshold)."""
    return (o.no_speech_threshold is not None and r.no_speech_prob > o.no_speech_threshold
            and (o.logprob_threshold is None or r.avg_logprob < o.logprob_threshold))


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


class Transcriber:
    """A target model and an optional draft, ready to transcribe audio."""

    def __init__(self, target: Whisper, draft: Draft | None = None):
        self.target, self.draft = target, draft
        self.vocab = target.vocab
        self.costs = CostModel()  # what passes cost on this machine, learnt while decoding

    def encode(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        enc = self.target.encode(mel)
        return enc, (self.draft.encoder_out(mel, enc) if self.draft else None)

    @torch.inference_mode()
    def detect_language(self, target_memory: torch.Tensor, lengths: list[int] | None = None) -> list[str]:
        """The most likely language of each window in the batch (Whisper's detection from <|startoftranscript|>)."""
        v = self.vocab
        dec = self.target.decoder
        cache = dec.new_cache(target_memory, 1, lengths)
        sot = torch.full((target_memory.shape[0], 1), v.sot, device=dec.device)
        logits = dec(cache, sot, torch.zeros_like(sot))[:, 0].float()
        codes, ids = list(v.languages), list(v.languages.values())
        return [codes[i] for i in logits[:, ids].argmax(dim=-1).tolist()]

    def prompt(self, previous: list[int], language: str | None, task: str, timestamps: bool) -> Request:
        """The decode request of a window: Whisper's prompt (previous text after <|startofprev|>, then the
        start-of-transcript sequence); prefix, hint, length and sampling key are added with ``replace``."""
        v = self.vocab
        head = [v.sot_prev] + previous[-(self.target.decoder.max_positions // 2 - 1):] if previous else []
        tail = v.sot_sequence(language, task) + ([] if timestamps else [v.no_timestamps])
        return Request(head + tail, len(head))

    def decode(self, memories: tuple[torch.Tensor, torch.Tensor | None], requests: list[Request],
               temperature: float = 0.0, timestamps: bool = True, *, k: int = 3, draft_stop: float = 0.0,
               seed: int = 0, use_draft: bool = True, adaptive_k: bool = True) -> list[RowResult]:
        """One speculative decode of a batch of windows (``memories`` rows match ``requests``). Sampling
        (``temperature`` > 0) draws with noise keyed by ``seed`` and each request's key: the same tokens with
        and without the draft, at any draft length."""
        draft = self.draft.decoder if (self.draft and use_draft) else None
        options = DecodeOptions(LogitRules.whisper(self.vocab, timestamps), self.vocab.eot, self.vocab.no_speech,
                                Sampler(temperature, seed), k if draft else 0, draft_stop)
        return speculative_decode(Decoders(self.target.decoder, draft, self.costs if adaptive_k else None),
                                  memories, requests, options)

    def needs_fallback(self, r: RowResult, o: TranscribeOptions) -> bool:
        """Whisper's checks on a decode (openai/whisper's order): repetitive text (compression ratio) or unlikely
        text (mean log-probability) is decoded again at the next temperature, unless the window is silent
        (no-speech probability above its threshold and mean log-probability below its threshold)."""
        silent = (o.no_speech_threshold is not None and r.no_speech_prob > o.no_speech_threshold
                  and o.logprob_threshold is not None and r.avg_logprob < o.logprob_threshold)
        if silent:
            return False
        repetitive = (o.compression_ratio_threshold is not None
                      and compression_ratio(self.target.tokenizer.decode(r.tokens)) > o.compression_ratio_threshold)
        return repetitive or (o.logprob_threshold is not None and r.avg_logprob < o.logprob_threshold)

    def suspect(self, r: RowResult, positions: int) -> bool:
        """Whether a decode of a window encoded at its audio's length (``positions`` encoder positions) looks
        like the decoder ran on without silence to end on: a timestamp past the audio it heard, or a phrase of
        4 or more tokens repeated at once. Such a window is decoded again on Whisper's padded 30 s window."""
        tb = self.vocab.timestamp_begin
        if any(t - tb > positions for t in r.tokens if t >= tb):
            return True
        text = [t for t in r.tokens if t < tb]
        return any(text[i:i + n] == text[i + n:i + 2 * n]
                   for n in range(4, len(text) // 2 + 1) for i in range(len(text) - 2 * n + 1))

    def transcribe(self, audio: np.ndarray, options: TranscribeOptions = TranscribeOptions(),
                   use_draft: bool = True, progress=None) -> Transcript:
        o, v = options, self.vocab
        stats = Stats(audio_seconds=len(audio) / SAMPLE_RATE)
        mel = log_mel(audio, self.target.n_mels)
        content = mel.shape[1] - N_FRAMES
        language = o.language if v.multilingual else None
        segments: list[Segment] = []
        all_tokens: list[int] = []
        prompt_since = 0
        seek = 0
        while seek < content:
            size = min(N_FRAMES, content - seek)
            offset = seek / FRAMES_PER_SECOND
            t0 = time.perf_counter()
            frames = encoder_frames(size, full=o.encoder_window == "full")
            memories = self.encode(window(mel, seek, frames)[None])
            stats.encoder_seconds += time.perf_counter() - t0
            t0 = time.perf_counter()
            if v.multilingual and language is None:
                language = self.detect_language(memories[0])[0]
            previous = all_tokens[prompt_since:] if o.condition_on_previous_text else []
            prompt = self.prompt(previous, language, o.task, o.timestamps)
            for i, temperature in enumerate(o.temperatures):
                request = replace(prompt, key=(seek, i))  # sampling noise keyed by window and attempt
                decode = partial(self.decode, temperature=temperature, timestamps=o.timestamps, k=o.k,
                                 draft_stop=o.draft_stop, seed=o.seed, use_draft=use_draft, adaptive_k=o.adaptive_k)
                result = decode(memories, [request])[0]
                if frames < N_FRAMES and (self.suspect(result, memories[0].shape[1]) or self.needs_fallback(result, o)):
                    frames = N_FRAMES  # decode this window again the way Whisper does: padded to 30 s
                    memories = self.encode(window(mel, seek, frames)[None])
                    stats.decode.add(result.stats)
                    stats.fallbacks += 1
                    result = decode(memories, [request])[0]
                stats.decode.add(result.stats)
                if i + 1 == len(o.temperatures) or not self.needs_fallback(result, o):
                    break
                stats.fallbacks += 1
            stats.decode_seconds += time.perf_counter() - t0
            stats.windows += 1

            if nothing_said(result, o):
                seek += size
            else:
                new, advance = self._segments(result, offset, size, temperature, stats.audio_seconds)
                segments.extend(new)
                all_tokens.extend(result.tokens)
                seek += max(advance, 1)
                if not o.condition_on_previous_text or temperature > 0.5:
                    prompt_since = len(all_tokens)
            if progress is not None:
                progress(min(seek, content) / FRAMES_PER_SECOND)
        text = "".join(s.text for s in segments).strip()
        return Transcript(text, segments, language, stats)

    def _segments(self, r: RowResult, offset: float, size: int, temperature: float,
                  duration_limit: float) -> tuple[list[Segment], int]:
        """Split a window's tokens at consecutive timestamp pairs; return segments and how far to seek."""
        tb = self.vocab.timestamp_begin
        toks = r.tokens
        is_ts = [t >= tb for t in toks]
        decode = self.target.tokenizer.decode

        def seg(start: float, end: float, part: list[int]) -> Segment:
            text = decode(part)
            start, end = (min(round(offset + t, 3), round(duration_limit, 3)) for t in (start, end))
            return Segment(start, end, text, part, temperature,
                           r.avg_logprob, compression_ratio(text), r.no_speech_prob)

        single_ending = is_ts[-2:] == [False, True]
        cuts = [i + 1 for i in range(len(toks) - 1) if is_ts[i] and is_ts[i + 1]]
        if cuts:
            if single_ending:
                cuts.append(len(toks))
            out, last = [], 0
            for cut in cuts:
                part = toks[last:cut]
                start, end = (part[0] - tb) * TOKEN_SECONDS, (part[-1] - tb) * TOKEN_SECONDS
                out.append(seg(start, end, part))
                last = cut
            advance = size if single_ending else (toks[last - 1] - tb) * 2
            return [s for s in out if s.text.strip()], advance
        stamps = [t for t in toks if t >= tb]
        duration = size / FRAMES_PER_SECOND
        if stamps and stamps[-1] != tb:
            duration = (stamps[-1] - tb) * TOKEN_SECONDS
        out = [seg(0.0, duration, toks)]
        return [s for s in out if s.text.strip()], size
