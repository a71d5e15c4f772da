"""Whisper's transcription loop over 30 s windows (openai/whisper ``transcribe``): language detection,
timestamped segments, seeking, prompting with previous text, temperature fallback. Every window is
decoded by the speculative decoder (or target-only when there is no draft)."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Hashable, Iterable, Iterator

import torch

from .alignment import align
from .audio import SAMPLE_RATE, Audio, AudioError, Cursor, blocks_of
from .decoding.beam import BeamOptions
from .decoding.rows import RowRequest, RowResult
from .decoding.speculative import DecodingTask
from .features import FRAMES_PER_SECOND, HOP, N_FRAMES, Features, WindowPadding, encoder_frames
from .models.pair import Pair
from .recognizer import (
    DRAFT_STOP,
    Checks,
    EncoderWindow,
    K,
    Recognizer,
    Retry,
    nothing_said,
    pad_memories,
)
from .segments import place_words, window_segments
from .transcript import Pieces, Segment, Stats, Transcript
from .vad import speech_chunks

DRAFT_MARGIN = 50  # encoder frames (1 s) the draft reads past the window's audio


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None  # None: detect (multilingual models)
    task: str = "transcribe"
    timestamps: bool = True
    k: int = K  # most drafted tokens per target pass
    draft_stop: float = DRAFT_STOP  # stop drafting when the draft's belief in its proposal falls below this
    adaptive_k: bool = False  # greedy: each pass drafts the 0..k tokens measured to pay most (False: always k)
    checks: Checks = Checks()  # Whisper's thresholds, fallback temperatures and the sampling seed
    # FULL: Whisper's padded 30 s window; AUDIO: only the window's audio (faster); its name ("full") will do
    encoder_window: EncoderWindow = EncoderWindow.FULL
    window_padding: WindowPadding = WindowPadding.AUDIO  # what follows a window's audio when it holds less than 30 s
    beam: BeamOptions | None = None  # beam search at temperature 0 (None: greedy)
    chunked: bool = False  # decode a file's speech as independent <= 30 s pieces, batched, without prompts
    initial_prompt: str | None = None  # text before the first window (Whisper's initial_prompt: names, spelling)
    hotwords: str | None = None  # text before every window's previous text (faster-whisper's hotwords: names, terms)
    word_timestamps: bool = False  # words with times in each segment (the text is the same either way)
    # the draft reads the encoder output of the window's audio and this many frames after it (None: the whole
    # window, as the target does); it only proposes, so this changes speed, never the text
    draft_margin: int | None = DRAFT_MARGIN

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoder_window", EncoderWindow(self.encoder_window))
        object.__setattr__(self, "window_padding", WindowPadding(self.window_padding))


Item = tuple[Hashable, Callable[[], Audio]] | tuple[Hashable, Callable[[], Audio], TranscribeOptions]
_END = object()  # an iterator's end (None is an item source's "nothing more now")


@dataclass
class _File:
    """One file's place in Whisper's window loop: where it has seeked to, the current window's encoder output and
    temperature attempt, and what it has transcribed so far."""
    key: Hashable  # (the file's key, piece number)
    offset: float  # where the piece starts in the file (seconds)
    load: Callable[[], Features]  # its features, made when it becomes active
    content: int  # mel frames of audio
    language: str | None
    stats: Stats
    task: str = "transcribe"
    seek: int = 0
    attempt: int = 0  # the current window's place on the temperature ladder
    frames: int = 0  # encoder frames of the current window (0: not encoded yet)
    memory: Pair[torch.Tensor] | None = None  # its encoder outputs [1, S, D]
    features: Features | None = None  # while active
    segments: list[Segment] = field(default_factory=list)
    all_tokens: list[int] = field(default_factory=list)
    prompt_since: int = 0

    @property
    def done(self) -> bool:
        return self.seek >= self.content

    @property
    def size(self) -> int:
        return min(N_FRAMES, self.content - self.seek)


@dataclass
class _Running:
    """The decode of files' windows at their first temperature, which the files' next windows join between passes
    (continuous batching): a window that finishes makes room at once for the next, its file's or another file's."""
    task: DecodingTask
    files: dict[int, _File] = field(default_factory=dict)  # request index -> its file, while its row runs


class Transcriber(Recognizer):
    """Whisper's window loop over files' audio, on a :class:`Recognizer`. Several files can be in flight: their
    current windows are decoded as one ragged batch, a file's next window joining it as soon as its window is done,
    while each file keeps its own sequential loop (previous text as prompt, seeking, temperature fallback), so a
    file's text does not depend on the files beside it."""

    def transcribe(self, audio: Audio, options: TranscribeOptions = TranscribeOptions(),
                   use_draft: bool = True, progress: Callable[[float], None] | None = None) -> Transcript:
        report = None if progress is None else (lambda _key, seconds: progress(seconds))
        ((_, result),) = self.transcribe_many([(0, lambda: audio)], options, 1, use_draft, report)
        return result

    def transcribe_many(self, items: Iterable[Item | None], options: TranscribeOptions = TranscribeOptions(),
                        batch_size: int = 1, use_draft: bool = True,
                        progress: Callable[[Hashable, float], None] | None = None,
                        before_step: Callable[[], None] | None = None,
                        make_room: Callable[[float], bool] | None = None,
                        ) -> Iterator[tuple[Hashable, Transcript | AudioError]]:
        """Transcribe (key, load audio) items with up to ``batch_size`` windows in flight, yielding (key,
        transcript) as each file finishes (not in input order), or (key, error) for audio that cannot be loaded.
        A finished window's place in the decode is taken between two passes by its file's next window, or the
        next file's first (continuous batching); audio is loaded only then. With
        ``options.chunked`` a file's speech chunks are its pieces (decoded side by side, then joined). Audio is
        an array or an :class:`AudioFile`, read a block at a time: then memory holds the windows in flight, not
        the files (each file is read twice: once to find its length and level, once as its windows go).

        An item may carry its own options (key, load, options): its language, task and initial prompt are its own;
        everything else is ``options``'. ``items`` may yield None: nothing more now (a server's queue), asked again
        at the next step; the call returns once nothing is in flight and the items say None or end.
        ``before_step`` runs before the first pass, then between two passes once as many windows have been decoded
        since as there are files in flight (about one window of each, as when a batch was decoded whole): the
        server holds uploads there while live streams are waiting to be decoded. ``make_room(seconds)``, asked when a
        file's window ends while ``batch_size`` files are in flight (``seconds``: the audio that file has left),
        says whether it should wait for a next item of the source to go first (a server's short upload before a long
        one): the file then resumes, where it was, when a file in flight is done."""
        source = iter(items)
        queued: deque[_File] = deque()
        active: list[_File] = []
        files: dict[Hashable, Pieces] = {}
        exhausted = False  # every item read: a decode opened from here on needs room only for what is left

        def admit(front: bool = False) -> Iterator[tuple[Hashable, Transcript | AudioError]]:
            """Take the source's next item: its pieces into ``queued`` (first with ``front``); what cannot be loaded,
            or holds no speech, is yielded at once. Returns whether it took one (False: none now, or no more)."""
            nonlocal exhausted
            while True:
                item = next(source, _END)
                if item is _END:
                    exhausted = True
                    return False
                if item is None:
                    return False
                key, load, o = item if len(item) == 3 else (*item, options)
                try:
                    pieces, length = self._pieces(load(), options)
                except AudioError as e:
                    yield key, e
                    continue
                prompt = self.target.tokenizer.encode(" " + o.initial_prompt.strip()) if o.initial_prompt else []
                files[key] = Pieces(length / SAMPLE_RATE, len(pieces))
                if not pieces:  # chunked, and no speech at all
                    yield key, files.pop(key).transcript()
                    continue
                new = [_File((key, n), a / SAMPLE_RATE, features, (b - a) // HOP,
                             o.language if self.vocab.multilingual else None,
                             Stats(audio_seconds=(b - a) / SAMPLE_RATE), o.task, all_tokens=list(prompt))
                       for n, (a, b, features) in enumerate(pieces)]
                if front:
                    queued.extendleft(reversed(new))
                else:
                    queued.extend(new)
                return True

        def finish(f: _File) -> Iterator[tuple[Hashable, Transcript]]:
            key, n = f.key
            f.features = None
            whole = files[key]
            whole.done[n] = f
            whole.left -= 1
            if progress is not None:
                whole.progress[n] = min(f.seek, f.content) / FRAMES_PER_SECOND
                progress(key, sum(whole.progress.values()))
            if not whole.left:
                del files[key]
                yield key, whole.transcript()

        running: _Running | None = None
        decoded = float("inf")  # windows decoded since ``before_step`` last ran (it runs before the first step)
        try:
            while True:
                while len(active) < batch_size:
                    if queued:
                        f = queued.popleft()
                        if f.done:
                            yield from finish(f)
                        else:
                            f.features = f.features or f.load()  # a file that made room resumes where it was
                            active.append(f)
                        continue
                    if exhausted or not (yield from admit()):
                        break
                if not active:
                    return
                if before_step is not None and decoded >= len(active):
                    before_step()
                    decoded = 0
                room = min(batch_size, len(active) + len(queued)) if exhausted else batch_size
                running, moved = self._step(active, running, options, use_draft, room)
                decoded += len(moved)
                for f in moved:
                    if f.done:
                        active.remove(f)
                        yield from finish(f)
                        continue
                    if progress is not None:
                        whole = files[f.key[0]]
                        whole.progress[f.key[1]] = f.seek / FRAMES_PER_SECOND
                        progress(f.key[0], sum(whole.progress.values()))
                    if make_room is not None and len(active) >= batch_size and not exhausted and \
                            make_room((f.content - f.seek) / FRAMES_PER_SECOND) and (yield from admit(front=True)):
                        active.remove(f)
                        queued.append(f)
        finally:
            if running is not None:
                running.task.close()

    def _step(self, files: list[_File], running: _Running | None, o: TranscribeOptions, use_draft: bool, room: int
              ) -> tuple[_Running | None, list[_File]]:
        """One step of the files' window loops: the windows not in the running decode are encoded; those at a
        fallback temperature are decoded at once (one batch per temperature), the others join the running decode
        (or start one with room for ``room`` rows); then it runs one pass. Returns the running decode (None once it
        has no row left) and the files whose window was decoded."""
        busy = {id(f) for f in running.files.values()} if running else set()
        waiting = [f for f in files if id(f) not in busy]
        self._encode(waiting, o)
        fallbacks = [f for f in waiting if f.attempt > 0 or o.beam is not None]  # beam searches: each whole at once
        self._decode(fallbacks, o, use_draft)
        fresh = [f for f in waiting if f.attempt == 0 and f.memory is not None and not f.done]
        if fresh:
            running = self._join(running, fresh, o, use_draft, room)
        if running is None:
            return None, fallbacks
        task, t0 = running.task, time.perf_counter()
        live = [running.files[r.index] for r in task.live]
        task.step()
        self.decoder_passes += bool(live)
        for f in live:
            f.stats.decode_seconds += (time.perf_counter() - t0) / len(live)
        moved = []
        for r, result in task.collect():
            moved.append(f := running.files.pop(r))
            self.decoded(f.memory.target[0], task.requests[r], result, o.checks.temperatures[0])
            self._take(f, result, o)
        if not task.live:
            task.close()
            running = None
        return running, fallbacks + moved

    def _pieces(self, audio: Audio, o: TranscribeOptions) -> tuple[list[tuple[int, int, Callable[[], Features]]], int]:
        """A file's pieces as (first sample, end, their features when they start), and its length in samples: the
        whole file (read through now, so an error in its audio is found here), or its speech chunks (each read
        when it starts: they start in order)."""
        if not o.chunked:
            features = Features(audio, self.target.n_mels)
            return [(0, features.length, lambda: features)], features.length
        chunks, length = speech_chunks(audio)
        cursor = Cursor(blocks_of(audio))
        return [(a, b, lambda a=a, b=b: Features(cursor.take(a, b), self.target.n_mels)) for a, b in chunks], length

    def _encode(self, files: list[_File], o: TranscribeOptions) -> None:
        """Encode the windows that need it and detect languages still unknown, one window per call on every
        device: a window's encoder output must not depend on the windows beside it (on CUDA the batched encoder's
        kernels differ by batch size: batch 8's text differed from batch 1's on 3 of 65 dev utterances on an H200),
        and on a CPU a batch is no faster (the encoder is compute-bound) while its attention matrices cost 0.6 GB
        at 8 windows."""
        for f in (f for f in files if f.memory is None):
            f.frames = f.frames or encoder_frames(f.size, full=o.encoder_window is EncoderWindow.FULL)
            self._encode_window(f, o)

    def _encode_window(self, f: _File, o: TranscribeOptions) -> None:
        t0 = time.perf_counter()
        audio = f.size if o.window_padding is WindowPadding.MEL else None
        f.memory = self.encode(f.features.window(f.seek, f.frames, audio)[None])
        f.stats.encoder_seconds += time.perf_counter() - t0
        if self.vocab.multilingual and f.language is None:
            t0 = time.perf_counter()
            f.language = self.detect_language(f.memory.target)[0]
            f.stats.decode_seconds += time.perf_counter() - t0

    def _rows(self, group: list[_File], o: TranscribeOptions, attempt: int) -> tuple[Pair[torch.Tensor],
                                                                                       list[RowRequest]]:
        """The encoder outputs and decode requests of the files' current windows."""
        lengths = [f.memory.target.shape[1] for f in group]
        ragged = len(set(lengths)) > 1
        memories = Pair(pad_memories([f.memory.target for f in group]),
                        None if group[0].memory.draft is None else pad_memories([f.memory.draft for f in group]))
        hot = self.target.tokenizer.encode(" " + o.hotwords.strip()) if o.hotwords and o.hotwords.strip() else []
        requests = [replace(self.prompt(f.all_tokens[f.prompt_since:], f.language, f.task, o.timestamps, hot),
                            key=(f.seek, attempt),  # sampling noise keyed by window and attempt
                            memory_length=n if ragged else None,
                            draft_memory_length=None if o.draft_margin is None else f.size // 2 + o.draft_margin)
                    for f, n in zip(group, lengths)]
        return memories, requests

    def _settings(self, o: TranscribeOptions, attempt: int, use_draft: bool) -> dict:
        """``decode``'s and ``open``'s settings for windows at this temperature attempt."""
        return dict(temperature=o.checks.temperatures[attempt], timestamps=o.timestamps, k=o.k,
                    draft_stop=o.draft_stop, seed=o.checks.seed, use_draft=use_draft, adaptive_k=o.adaptive_k,
                    keep_cross=o.word_timestamps,
                    static=o.encoder_window is EncoderWindow.FULL)  # one memory length: one arena

    def _decode(self, files: list[_File], o: TranscribeOptions, use_draft: bool) -> None:
        """Decode every file's current window, one batch per temperature, and take the results."""
        for attempt in sorted({f.attempt for f in files}):
            group = [f for f in files if f.attempt == attempt]
            t0 = time.perf_counter()
            memories, requests = self._rows(group, o, attempt)
            if attempt == 0 and o.beam is not None:
                results = self.beam(memories.target, requests, o.timestamps, o.beam, o.k, use_draft)
            else:
                results = self.decode(memories, requests, **self._settings(o, attempt, use_draft))
            share = (time.perf_counter() - t0) / len(group)
            for f, request, result in zip(group, requests, results):
                f.stats.decode_seconds += share
                self.decoded(f.memory.target[0], request, result, o.checks.temperatures[attempt])
                self._take(f, result, o)

    def decoded(self, memory: torch.Tensor, request: RowRequest, result: RowResult, temperature: float) -> None:
        """Every window decode, before Whisper's checks: the window's encoder output [S, D], its request and result
        (a subclass keeps them: distillation's labels)."""

    def _join(self, running: _Running | None, files: list[_File], o: TranscribeOptions, use_draft: bool,
              room: int) -> _Running | None:
        """The files' windows (first temperature) join the running decode, or start one; they wait for the next
        step where it cannot take them (a static decode's arena holds other shapes)."""
        memories, requests = self._rows(files, o, 0)
        t0 = time.perf_counter()
        if running is None:
            running = _Running(self.open(memories, requests, **self._settings(o, 0, use_draft), room=room))
            running.task.start()
            ids = range(len(requests))
        elif running.task.can_join(memories, requests):
            ids = running.task.join(memories, requests)
        else:
            return running
        for f, r in zip(files, ids):
            running.files[r] = f
            f.stats.decode_seconds += (time.perf_counter() - t0) / len(files)
        return running

    def _take(self, f: _File, result: RowResult, o: TranscribeOptions) -> None:
        """Whisper's decision on a decoded window: decode it again (padded to 30 s when it was encoded shorter and
        looks wrong, else at the next temperature when it fails the checks), or keep it and seek on."""
        c = o.checks
        f.stats.decode.add(result.stats)
        if retry := self.retry(result, f.memory.target.shape[1], f.frames >= N_FRAMES, f.attempt, c):
            f.stats.fallbacks += 1
            if retry is Retry.PAD:  # decode this window again the way Whisper does: padded to 30 s
                f.frames, f.memory = N_FRAMES, None
            else:
                f.attempt += 1
            return
        temperature = c.temperatures[f.attempt]
        f.stats.windows += 1
        size = f.size
        if nothing_said(result, c):
            f.seek += size
        else:
            new, advance = window_segments(result, self.vocab.timestamp_begin, self.target.tokenizer.decode,
                                           f.offset + f.seek / FRAMES_PER_SECOND, size, temperature,
                                           f.offset + f.stats.audio_seconds)
            if o.word_timestamps:
                self._add_words(f, new, size, result)
            f.segments.extend(new)
            f.all_tokens.extend(t for segment in new for t in segment.tokens)  # the next windows' prompt
            f.seek += max(advance, 1)
            if o.chunked or temperature > 0.5:
                f.prompt_since = len(f.all_tokens)
        f.attempt, f.frames, f.memory = 0, 0, None

    def _add_words(self, f: _File, segments: list[Segment], size: int, r: RowResult) -> None:
        """Word timestamps for a window's segments (timed as decoding)."""
        t0 = time.perf_counter()
        aligned = align(self.target, f.memory.target, size, f.language, f.task, [s.tokens for s in segments], r.cross)
        place_words(segments, aligned, f.offset + f.seek / FRAMES_PER_SECOND)
        f.stats.decode_seconds += time.perf_counter() - t0
