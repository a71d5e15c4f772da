"""Whisper's transcription loop over 30 s windows (openai/whisper ``transcribe``): language detection,
timestamped segments, seeking, prompting with previous text, temperature fallback. Every window is
decoded by the speculative decoder (or target-only when there is no draft)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from .audio import SAMPLE_RATE
from .decoding.speculative import RowResult, RowStats
from .features import FRAMES_PER_SECOND, N_FRAMES, TOKEN_SECONDS, encoder_frames, log_mel, window
from .recognizer import DRAFT_STOP, K, Checks, Recognizer, compression_ratio, nothing_said


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None  # None: detect (multilingual models)
    task: str = "transcribe"
    timestamps: bool = True
    k: int = K  # most drafted tokens per target pass
    draft_stop: float = DRAFT_STOP  # stop drafting when the draft's belief in its proposal falls below this
    adaptive_k: bool = True  # greedy: each pass drafts the 0..k tokens measured to pay most (False: always k)
    checks: Checks = Checks()  # Whisper's thresholds, fallback temperatures and the sampling seed
    condition_on_previous_text: bool = True
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


class Transcriber(Recognizer):
    """Whisper's window loop over a file's audio, on a :class:`Recognizer`."""

    def transcribe(self, audio: np.ndarray, options: TranscribeOptions = TranscribeOptions(),
                   use_draft: bool = True, progress=None) -> Transcript:
        o, c, v = options, options.checks, self.vocab
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
            for i, temperature in enumerate(c.temperatures):
                request = replace(prompt, key=(seek, i))  # sampling noise keyed by window and attempt
                decode = partial(self.decode, temperature=temperature, timestamps=o.timestamps, k=o.k,
                                 draft_stop=o.draft_stop, seed=c.seed, use_draft=use_draft, adaptive_k=o.adaptive_k)
                result = decode(memories, [request])[0]
                if frames < N_FRAMES and (self.suspect(result, memories[0].shape[1]) or self.needs_fallback(result, c)):
                    frames = N_FRAMES  # decode this window again the way Whisper does: padded to 30 s
                    memories = self.encode(window(mel, seek, frames)[None])
                    stats.decode.add(result.stats)
                    stats.fallbacks += 1
                    result = decode(memories, [request])[0]
                stats.decode.add(result.stats)
                if i + 1 == len(c.temperatures) or not self.needs_fallback(result, c):
                    break
                stats.fallbacks += 1
            stats.decode_seconds += time.perf_counter() - t0
            stats.windows += 1

            if nothing_said(result, c):
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
