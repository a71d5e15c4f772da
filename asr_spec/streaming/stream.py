"""One live audio stream: a growing buffer re-decoded as audio arrives, its policy committing text.

Per re-decode the target continues after the tokens already committed in the buffer (forced as a prefix), so a
hypothesis is committed text + a continuation. The stream's commit policy (policy.py: AlignAtt or
LocalAgreement-2) says how much of the continuation is final now; the rest is the partial and the next decode's
draft hint. The buffer is trimmed at the end of a committed segment once it grows past ``trim_s``; committed text
that leaves the buffer becomes the prompt. Voice activity detection drops silence and ends utterances (intake.py);
events are built by events.py.

Nothing is lost: a buffer that reaches ``max_buffer_s`` (speech without pauses, or audio arriving faster than it
is decoded) is committed window by window as ``transcribe`` does offline — the first 30 s are decoded, committed
up to the last complete segment, and only that audio leaves the buffer. Every sample received leaves the buffer
exactly once, decoded or (silence) skipped: ``stats`` counts both.
"""
from __future__ import annotations

from ..alignment import held
from ..audio import SAMPLE_RATE
from ..features import N_SAMPLES, TOKEN_SECONDS
from ..recognizer import nothing_said
from . import intake
from .boundaries import Boundaries
from .config import StreamConfig
from .encoding import BufferEncoder
from .events import Emitter, Event, StreamStats
from .intake import Intake
from .request import Decoded, RequestKind, StreamRequest


class Stream:
    """State of one stream. ``feed`` audio; the engine's :func:`listen` takes it in (voice detection of what arrived,
    every stream's at once), and when ``due()`` decodes ``request()`` and hands the result to ``apply``, which returns
    the events to send."""

    def __init__(self, config: StreamConfig, tokenizer, encoder: BufferEncoder | None = None):
        self.config = config
        self.vocab = tokenizer.vocab
        self.stats = StreamStats()
        self.intake = Intake(self.stats, config.vad, config.vad_threshold, config.preroll_s)
        self.emit = Emitter(tokenizer, self.stats, config.interim, config.word_timestamps)
        self.boundaries = Boundaries(tokenizer)
        self.policy = config.policy
        self.encoder = encoder
        self.language = config.language  # detected per utterance when None
        self.hotwords = tokenizer.encode(" " + config.hotwords.strip()) if config.hotwords.strip() else []
        self.committed: list[int] = []  # tokens committed in the buffer (timestamps relative to its start)
        # tokens committed before the buffer, timestamps included (the prompt); at first StreamConfig.prompt's
        self.context: list[int] = tokenizer.encode(" " + config.prompt.strip()) if config.prompt.strip() else []
        self.previous: list[int] = []  # the last continuation: for LocalAgreement-2, and the next draft hint
        self.flush_requested = False
        self.flush_upto = 0.0  # audio seconds received when the pending flush was asked for
        self.closing = False  # the flush requested is the last one (``close``): decode whatever is left
        self.flushes = 0  # completed flushes
        self._decoded: Decoded | None = None  # while ``apply`` runs

    # --- audio in -------------------------------------------------------------------------------------
    def feed(self, audio) -> None:
        """Queue received audio (analysed later, by the engine's thread: ``listen``)."""
        self.intake.feed(audio)
        self.emit.arrived(self.stats.audio_s)

    def flush(self, close: bool = False) -> None:
        """Decode what is buffered to the end (``finalize``; ``close`` when no audio will follow). Requests
        coalesce: one pending flush at a time."""
        self.flush_requested = True
        self.closing = self.closing or close
        self.flush_upto = self.stats.audio_s

    # --- scheduling -----------------------------------------------------------------------------------
    @property
    def backlog_s(self) -> float:
        return self.intake.backlog_s

    @property
    def waiting_since(self) -> float | None:
        return self.intake.waiting_since

    @property
    def silent(self) -> bool:
        """Nothing worth decoding: no speech in the buffer and nothing committed from it."""
        return not self.intake.speech and not self.committed

    def due(self, min_step_s: float = 0.0, share: float = 1.0) -> RequestKind | None:
        """What the buffer needs now (after ``listen``): FINAL (decode and commit everything: end of utterance
        or flush), WINDOW (the buffer is full: commit its first window), PARTIAL (re-decode: ``share`` of
        ``step_s`` of new audio, or of ``min_step_s`` when the engine asks for more under load), or None. A flush is
        due once the buffer holds all the audio received before it: audio and a ``close`` that arrive between the
        engine's ``listen`` and its decode would otherwise leave the last frame to be decoded alone, and Whisper
        answers a tenth of a second of audio with a hallucination ("you", or the prompt again)."""
        c, intake = self.config, self.intake
        if self.flush_requested and intake.end >= self.flush_upto - 1e-6:
            return RequestKind.FINAL
        if not intake.speech:
            return None
        if intake.vad is not None and intake.silence_s >= c.end_silence_s:
            return RequestKind.FINAL
        if intake.buffer_s >= c.max_buffer_s:
            return RequestKind.WINDOW
        return RequestKind.PARTIAL if intake.since_decode >= share * max(c.step_s, min_step_s) else None

    def settle_flush(self) -> list[Event] | None:
        """Complete a requested flush that needs no decode, returning its events: a buffer without speech is
        skipped; a ``finalize`` of less than ``min_flush_s`` is deferred (its audio stays, to be decoded with
        what follows — a fraction of a second alone is what Whisper hallucinates on). None: decode it."""
        if not self.flush_requested:
            return None
        if self.silent:
            return self._commit_all([], len(self.intake.audio))
        if not self.closing and self.intake.buffer_s < self.config.min_flush_s:
            self.flush_requested = False
            self.flushes += 1
            return []
        return None

    def request(self, kind: RequestKind) -> StreamRequest:
        """The decode to run now for ``kind`` (from ``due``). A final of more than one window is committed
        window by window first."""
        audio = self.intake.audio
        if kind is RequestKind.FINAL and len(audio) > N_SAMPLES:
            kind = RequestKind.WINDOW
        if kind is RequestKind.WINDOW:
            audio = audio[:N_SAMPLES]
        elif kind is RequestKind.FINAL:
            audio = audio[:self._utterance_end()]
        hint = self.previous if self.config.use_hint else []
        context = self.context if kind is RequestKind.WINDOW else [t for t in self.context if t < self.vocab.eot]
        return StreamRequest(audio, self.intake.start, context, self.language, self.config.task, list(self.committed),
                             hint, kind, self.intake.taken(), aligns=kind is RequestKind.PARTIAL and self.policy.aligns,
                             timed=self.policy.aligns or self.config.word_timestamps, encoder=self.encoder,
                             hotwords=self.hotwords, languages=self.config.languages)

    # --- results --------------------------------------------------------------------------------------
    def apply(self, request: StreamRequest, decoded: Decoded) -> list[Event]:
        """Take a decode's result: commit what it and the policy allow, return the events to send. A decode that
        failed Whisper's checks even after its fallback is never committed from by a partial."""
        self._decoded = decoded
        try:
            return self._apply(request, decoded)
        finally:
            self._decoded = None

    def _apply(self, request: StreamRequest, decoded: Decoded) -> list[Event]:
        result = decoded.result
        self.stats.decodes += 1
        self.stats.fallbacks += decoded.fallbacks
        self.stats.decode.add(result.stats)
        self.language = decoded.language or self.language
        cont = result.tokens[len(request.prefix):]
        if nothing_said(result):
            cont = []  # Whisper's no-speech rule
        if decoded.fallbacks and not decoded.reliable:
            self.context = []  # as Whisper does after a failed window: do not prompt with text that loops
        heard = len(request.audio)
        if request.kind is RequestKind.FINAL:
            cont = self._held(cont)
            if self._ended_early(cont, heard):  # commit what was said, decode the rest again
                return self._commit_window(cont, heard)
            if (said := self._words_end_early(cont, heard)) is not None:
                return self._commit_said(cont, said)
            return self._commit_all(cont, heard)
        if request.kind is RequestKind.WINDOW:
            return self._commit_window(cont, heard, cut_off=True)
        if not decoded.reliable:
            cont = []
        n = self.policy.commit(self.boundaries, cont, self.previous, lambda: self._words(self.committed, cont),
                               heard / SAMPLE_RATE)
        agreed, events = cont[:n], []
        if agreed:
            if any(t < self.vocab.eot for t in agreed):  # a lone timestamp is committed without an empty final
                events.append(self._final(agreed, end_of_utterance=False))
            self.committed += agreed
        self.previous = cont[n:]
        events += self._partial_event()
        self._trim()
        return events

    def _words(self, before: list[int], tokens: list[int]) -> list:
        """The words of ``tokens`` (decoded after ``before``) aligned, up to the first run the audio does not hold
        (alignment.held): no commit reaches into a hallucination."""
        aligner = None if self._decoded is None else self._decoded.aligner
        words = aligner(list(before), list(tokens)) if aligner is not None else []
        return words[:held(words)]

    def _held(self, cont: list[int]) -> list[int]:
        """A final decode's continuation up to its words' first run that the audio does not hold (alignment.held): on
        what is left of an utterance Whisper may say its last sentence again ("... in Germany and France. Not only
        in Italy, but in Germany and France.", the copy aligned on one frame), and a final commits all it keeps."""
        aligner = None if self._decoded is None else self._decoded.aligner
        if aligner is None or not any(t < self.vocab.eot for t in cont):
            return cont
        words = aligner(list(self.committed), list(cont))
        if (n := held(words)) == len(words):
            return cont
        return cont[:self.boundaries.text_tokens(cont, sum(w.tokens for w in words[:n]))]

    # --- commits --------------------------------------------------------------------------------------
    def _commit_all(self, cont: list[int], decoded: int) -> list[Event]:
        """Commit the whole continuation and drop the ``decoded`` samples from the buffer: the utterance ended
        (trailing silence or a flush). Audio that arrived during the decode stays."""
        events = []
        if cont or self.committed or self.flush_requested:  # every utterance ends with a final
            events.append(self._final(cont, end_of_utterance=True, decoded=decoded))
        self._add_context(self.committed + cont)
        self.intake.drop(decoded, decoded=bool(self.intake.speech or self.committed))
        self.committed, self.previous, self.emit.partial = [], [], ""
        self.intake.utterance_done()
        self.language = self.config.language
        # a flush is done once all it asked for has left the buffer (a decode requested before it covers less)
        if self.flush_requested and self.stats.decoded_s + self.stats.skipped_s >= self.flush_upto - 1e-6:
            self.flushes += 1
            self.flush_requested = False
        self.stats.utterances += 1
        return events

    def _commit_window(self, cont: list[int], decoded: int, cut_off: bool = False) -> list[Event]:
        """The buffer is full: commit the decoded window up to its last complete segment (the timestamp that
        closes it) and drop only that audio; the rest stays buffered and is decoded again, as Whisper's
        offline loop seeks. Without a segment end, the whole window is committed and dropped. ``cut_off``: the
        window ends inside speech that goes on, so a segment that ends with it is likely cut short ("the art of
        print."): with word alignment, the words the audio supports are committed (:meth:`_commit_words`; a decode
        that ran on past its audio, repeating committed text, is not); else the last segment end at least
        ``window_guard_s`` before the window's end is taken, if any."""
        tb = self.vocab.timestamp_begin
        every = self.committed + cont
        ends = self._segment_ends(every)
        if cut_off and (words := self._words([], every)) and (events := self._commit_words(cont, words, decoded)) is not None:
            return events
        if not ends:
            events = [self._final(cont, end_of_utterance=False, decoded=decoded)] if cont else []
            self._add_context(self.committed + cont)
            self.intake.drop(decoded)
            self.committed, self.previous = [], []
            return events + self._partial_event()
        guard = decoded / SAMPLE_RATE - self.config.window_guard_s
        before = [i for i in ends if (every[i] - tb) * TOKEN_SECONDS <= guard]
        cut = before[-1] if cut_off and before else ends[-1]
        done = len(self.committed)
        events = [self._final(every[done:cut + 1], end_of_utterance=False)] if cut + 1 > done else []
        self._cut_at(every, cut, keep_committed=done)
        return events + self._partial_event()

    def _commit_words(self, cont: list[int], words: list, decoded: int) -> list[Event] | None:
        """A full buffer whose speech goes on: commit its words up to the last one ending ``window_guard_s`` before
        its end (``words``: those of committed + ``cont``, aligned) and drop the audio up to that word's end. The
        rest stays buffered and is decoded again. None when no word ends in the buffer's first half (nothing worth
        dropping: the window is committed at its segments)."""
        heard = decoded / SAMPLE_RATE - self.config.window_guard_s
        done = sum(t < self.vocab.eot for t in self.committed)  # text tokens committed already
        text_tokens, end = 0, 0.0
        for w in words[:-1]:
            if w.end > heard and text_tokens >= done:
                break
            text_tokens, end = text_tokens + w.tokens, w.end
        if end < decoded / SAMPLE_RATE / 2:
            return None
        b = self.boundaries
        n = b.forward(cont, b.text_tokens(cont, text_tokens - done))  # never cut inside a word
        events = [self._final(cont[:n], end_of_utterance=False, decoded=int(end * SAMPLE_RATE))] if n else []
        self._add_context(self.committed + cont[:n])
        self.committed = []
        self.previous = [self.vocab.timestamp_begin] + [t for t in cont[n:] if t < self.vocab.eot]
        self.intake.drop(int(round(end * SAMPLE_RATE)))
        return events + self._partial_event()

    def _commit_said(self, cont: list[int], said: int) -> list[Event]:
        """A final decode whose words end well before its speech does (:meth:`_words_end_early`): commit the whole
        continuation, drop the audio up to its last word's end (``said`` samples) and keep the rest buffered, to be
        decoded again; the flush or the utterance's end stays due."""
        events = [self._final(cont, end_of_utterance=False, decoded=said)] if any(t < self.vocab.eot for t in cont) else []
        self._add_context(self.committed + cont)
        self.committed, self.previous = [], []
        self.intake.drop(said)
        return events

    def _trim(self) -> None:
        """Cut the buffer after the last committed segment that is closed by a timestamp pair."""
        if self.intake.buffer_s <= self.config.trim_s:
            return
        tb, c = self.vocab.timestamp_begin, self.committed
        cut = next((i for i in range(len(c) - 2, -1, -1) if c[i] >= tb and c[i + 1] >= tb), None)
        if cut is not None:
            self._cut_at(c + self.previous, cut, keep_committed=len(c))

    def _cut_at(self, tokens: list[int], cut: int, keep_committed: int) -> None:
        """Drop the buffer's audio up to the timestamp ``tokens[cut]``: the tokens up to it become context, those
        after it up to ``keep_committed`` stay committed, the rest is the hint; their timestamps move with the
        buffer's start."""
        tb = self.vocab.timestamp_begin
        shift = tokens[cut] - tb
        self._add_context(tokens[:cut + 1])
        rebase = lambda ts: [t - shift if t >= tb else t for t in ts]  # noqa: E731
        self.committed = rebase(tokens[cut + 1:max(cut + 1, keep_committed)])
        self.previous = rebase(tokens[max(cut + 1, keep_committed):])
        self.intake.drop(int(round(shift * TOKEN_SECONDS * SAMPLE_RATE)))

    def _add_context(self, tokens: list[int]) -> None:
        """Append committed tokens to the prompt, timestamps kept. A window commit is prompted with them, as
        Whisper's offline loop prompts a window: prompted with text alone, Whisper answered a full window in
        kind, one timestamp-less run that ended before the window's speech did (and the window committed
        from it lost those words). Re-decodes of a growing buffer are prompted with the text alone: with
        timestamps, a real-time stream of the long-form talk went from 2.8 % to 10.8 % WER against offline."""
        tb = self.vocab.timestamp_begin
        self.context = (self.context + [t for t in tokens if t < self.vocab.eot or t >= tb])[-self.config.max_context:]

    # --- helpers --------------------------------------------------------------------------------------
    def _utterance_end(self) -> int:
        """Where a final ends in the buffer (samples). An utterance ended by trailing silence (no flush) is
        decoded and committed only up to half that silence past the last voiced audio: the rest may hold the
        quiet onset of the next word, which voice detection has not flagged yet. Decoding the audio the final
        commits and nothing more keeps Whisper from ending its text on such an onset ("ask not" came back
        as "is not") or from leaving the tail of a transcribed word to be transcribed again ("country.
        Country.")."""
        intake = self.intake
        if intake.vad is None or self.flush_requested or intake.last_voiced <= intake.start:
            return len(intake.audio)
        end = intake.last_voiced - intake.start + self.config.end_silence_s / 2
        return min(len(intake.audio), int(round(end * SAMPLE_RATE)))

    def _ended_early(self, cont: list[int], decoded: int) -> bool:
        """Whether a final decode's text stops (at its last timestamp) before the speech in the audio it heard does:
        ``unheard_s`` before it (Whisper sometimes ends a window early), or at all where the decode ends on a timestamp
        pair (a segment closed, the next begun and cut by the window's end: where Whisper's offline loop always seeks
        to the last timestamp; a 29.4 s final ended so 0.92 s before its speech did, and "and France." was lost).
        Committing the whole buffer would drop the words after it; as Whisper's loop seeks, the rest is decoded again."""
        every = self.committed + cont
        ends = self._segment_ends(every)
        if not ends:
            return False
        tb = self.vocab.timestamp_begin
        text_end = (every[ends[-1]] - tb) * TOKEN_SECONDS
        unheard = self._speech_end(decoded) - text_end
        paired = every[-1] >= tb and every[-2] >= tb
        return text_end > 0 and (unheard >= self.config.unheard_s or (paired and unheard > 0))

    def _words_end_early(self, cont: list[int], decoded: int) -> int | None:
        """Where (samples into the buffer) a final decode's words end, when its text closes with a timestamp at or
        near the speech's end but its aligned words end ``unheard_s`` or more before the speech does: Whisper
        sometimes closes a last segment long after its few words ("bravely trudged on alone." stretched over 12 s,
        the sentence after it never decoded). As Whisper's offline loop does with word timestamps, which seeks to
        the last word's end, the rest is decoded again. None otherwise, or without aligned words."""
        words = self._words(self.committed, cont) if any(t < self.vocab.eot for t in cont) else []
        if not words:
            return None
        speech_end = self._speech_end(decoded)
        said = words[-1].end
        if said < self.config.unheard_s or speech_end - said < self.config.unheard_s:
            return None
        return min(decoded, int(round(said * SAMPLE_RATE)))

    def _speech_end(self, decoded: int) -> float:
        """Seconds into the buffer where its speech ends, by voice detection (without it: the ``decoded`` samples')."""
        intake = self.intake
        return decoded / SAMPLE_RATE if intake.vad is None else intake.last_voiced - intake.start

    def _segment_ends(self, tokens: list[int]) -> list[int]:
        """Indices of the timestamps that close a segment (after text, followed by a timestamp or the end)."""
        tb = self.vocab.timestamp_begin
        return [i for i in range(1, len(tokens)) if tokens[i] > tb and tokens[i - 1] < tb
                and (i + 1 == len(tokens) or tokens[i + 1] >= tb)]

    def _final(self, tokens: list[int], end_of_utterance: bool, decoded: int | None = None) -> Event:
        intake = self.intake
        heard = intake.start + (len(intake.audio) if decoded is None else decoded) / SAMPLE_RATE
        aligner = None if self._decoded is None else self._decoded.aligner
        # a final's tokens are always the first of its decode's continuation: their log-probabilities come first too
        logprobs = None if self._decoded is None else self._decoded.result.logprobs[:len(tokens)]
        return self.emit.final(tokens, self.committed, intake.start, heard, end_of_utterance, aligner, logprobs)

    def _partial_event(self) -> list[Event]:
        return self.emit.partial_event(self.previous, self.committed, self.intake.start, self.intake.end)


def listen(streams: list[Stream]) -> None:
    """Each stream's queued audio taken into its buffer, voice detected in all of it together (a stream's flags are
    the same alone or in company)."""
    intake.listen([(s.intake, bool(s.committed)) for s in streams])
