"""One live audio stream: a growing buffer re-decoded as audio arrives, AlignAtt or LocalAgreement-2 commits.

Per re-decode the target continues after the tokens already committed in the buffer (forced as a
prefix), so a hypothesis is committed text + a continuation. What of the continuation is committed and sent
as a ``final`` depends on the policy; the rest is the ``partial`` (and the next decode's draft hint):
- ``alignatt`` (SimulStreaming's AlignAtt, after ONE decode): the continuation's words whose audio ends, by the
  cross-attention of the model's alignment heads (Whisper's word alignment), at least ``alignatt_margin_s``
  before the decoded audio does; the last word is held back (it may be unfinished);
- ``local-agreement`` (whisper_streaming's LocalAgreement-2): the longest common prefix of this continuation
  and the previous one, cut back to a word boundary. The buffer is trimmed at the end of a committed segment once it grows
past ``trim_s``; committed text that leaves the buffer becomes the prompt. Voice activity detection
drops silence and ends utterances.

Nothing is lost: a buffer that reaches ``max_buffer_s`` (speech without pauses, or audio arriving faster
than it is decoded) is committed window by window as ``transcribe`` does offline — the first 30 s are
decoded, committed up to the last complete segment, and only that audio leaves the buffer. Every sample
received leaves the buffer exactly once, decoded or (silence) skipped: ``stats`` counts both.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..alignment import APPEND, Word
from ..audio import SAMPLE_RATE
from ..decoding.speculative import RowResult, RowStats
from ..recognizer import nothing_said
from ..features import N_SAMPLES, TOKEN_SECONDS
from ..vad import VoiceActivity
from . import POLICIES, STEP_S


@dataclass(frozen=True)
class StreamConfig:
    language: str | None = "en"  # None: detect at the start of each utterance (multilingual models)
    task: str = "transcribe"
    interim: bool = True  # send partial results
    step_s: float = STEP_S  # re-decode once this much new audio has arrived (the engine waits longer under load)
    end_silence_s: float = 0.6  # trailing silence that ends an utterance
    trim_s: float = 12.0  # trim the buffer at committed segment ends once it is longer than this
    max_buffer_s: float = 24.0  # a longer buffer is flushed whole (Whisper sees at most 30 s)
    window_guard_s: float = 1.0  # a full buffer is committed up to a word or segment end this long before its end
    vad: bool = True
    vad_threshold: float = 0.5
    preroll_s: float = 0.3  # audio kept before detected speech
    use_hint: bool = True  # the previous continuation drafts the next re-decode
    min_flush_s: float = 1.0  # a finalize of a shorter buffer is deferred: decoded with the audio that follows
    max_context: int = 192  # committed tokens kept as the prompt (prompt + prefix stay well under 448)
    unheard_s: float = 1.0  # a final whose text ends this long before speech does is committed only that far
    word_timestamps: bool = False  # finals carry their words with times (Whisper's alignment; the engine adds them)
    policy: str = POLICIES[0]  # what a re-decode commits: "alignatt" or "local-agreement" (see the module's text)
    alignatt_margin_s: float = 0.5  # AlignAtt commits words that end at least this long before the decoded audio
    # ... if the target is sure of them (probability at least this); a word it is less sure of waits until it ends
    # ``alignatt_unsure_margin_s`` before the decoded audio: Whisper's early mistakes ("their" for "there") are such
    # words, which more audio after them corrects (dev WER 8.39 % without the rule, 7.53 % at 0.7, 7.18 % at 0.8 or
    # 0.9; offline 6.92 %; docs/how-it-works.md)
    alignatt_min_probability: float = 0.8
    alignatt_unsure_margin_s: float = 3.0


@dataclass
class Segment:
    start: float
    end: float
    text: str


# times a final's words: (tokens decoded before it in the buffer, its own tokens) -> its words, in seconds from the
# buffer's start (the engine's Whisper alignment over the audio the tokens were decoded from)
Aligner = Callable[[list[int], list[int]], list[Word]]


@dataclass
class Event:
    type: str  # "partial", "final", or "error" (the engine could not decode the stream, which it has ended)
    text: str  # for "error": the message
    start: float
    end: float
    segments: list[Segment] = field(default_factory=list)
    end_of_utterance: bool = False
    words: list[Word] | None = None  # a final's words, when its stream asked for word timestamps
    join: str = ""  # what goes between the stream's previous final and this text: " ", or "" (punctuation, first)

    def as_dict(self) -> dict:
        if self.type == "error":
            return {"type": "error", "code": "decode_failed", "message": self.text}
        d = {"type": self.type, "text": self.text, "join": self.join, "start": round(self.start, 3),
             "end": round(self.end, 3)}
        if self.type == "final":
            d["segments"] = [{"start": round(s.start, 3), "end": round(s.end, 3), "text": s.text} for s in self.segments]
            d["end_of_utterance"] = self.end_of_utterance
            if self.words is not None:
                d["words"] = [w.as_dict() for w in self.words]
        return d


@dataclass
class Request:
    """What one re-decode of a stream needs: its audio, prompt context and forced prefix."""
    audio: np.ndarray
    context: list[int]
    language: str | None
    task: str
    prefix: list[int]
    hint: list[int]
    kind: str  # "partial" (re-decode), "window" (commit the first 30 s up to a segment end), "final" (commit all)
    waited_s: float = 0.0  # how long the stream's oldest undecoded audio had waited when this was requested
    aligns: bool = False  # its result's continuation will be aligned (AlignAtt): the engine aligns rows together


    @property
    def final(self) -> bool:
        return self.kind != "partial"


@dataclass
class StreamStats:
    audio_s: float = 0.0  # received
    decoded_s: float = 0.0  # left the buffer after a decode that covered it
    skipped_s: float = 0.0  # left the buffer as silence, never decoded
    decodes: int = 0
    fallbacks: int = 0  # decodes repeated at a higher temperature (Whisper's hallucination checks)
    utterances: int = 0
    decode: RowStats = field(default_factory=RowStats)
    final_latency_s: deque = field(default_factory=lambda: deque(maxlen=1000))  # emission - arrival of its end

    def as_dict(self) -> dict:
        d, lat = self.decode, sorted(self.final_latency_s)
        pct = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 3) if lat else None  # noqa: E731
        return {"audio_seconds": round(self.audio_s, 3), "decoded_seconds": round(self.decoded_s + self.skipped_s, 3),
                "silence_skipped_seconds": round(self.skipped_s, 3), "decodes": self.decodes,
                "fallbacks": self.fallbacks, "utterances": self.utterances,
                "tokens": d.tokens, "target_passes": d.target_passes, "drafted": d.drafted, "accepted": d.accepted,
                "acceptance": round(d.acceptance, 4), "final_latency_median_s": pct(0.5), "final_latency_p90_s": pct(0.9)}


class Stream:
    """State of one stream. ``feed`` audio; when ``due()`` the engine decodes ``request()`` and hands the
    result to ``apply``, which returns the events to send."""

    def __init__(self, config: StreamConfig, tokenizer):
        self.config = config
        self.vocab, self.tokenizer = tokenizer.vocab, tokenizer
        self.language = config.language  # detected per utterance when None
        self.vad = VoiceActivity(config.vad_threshold) if config.vad else None
        self.audio = np.zeros(0, dtype=np.float32)
        self.start = 0.0  # stream time of audio[0]
        self.speech = not config.vad  # speech somewhere in the buffer
        self.last_voiced = -1.0  # stream time of the end of the last voiced chunk
        self.silence_s = 0.0  # trailing non-speech
        self.since_decode = 0.0  # audio seconds since the audio of the last decode request
        self.committed: list[int] = []  # tokens committed in the buffer (timestamps relative to its start)
        self.context: list[int] = []  # tokens committed before the buffer, timestamps included (the prompt)
        self.previous: list[int] = []  # the last continuation, for LocalAgreement-2 and as a draft hint
        self.partial = ""
        self.emitted_end = 0.0  # end time of the last final sent
        self.said = False  # a final with text has been sent (the next one joins it with a space)
        self.flush_requested = False
        self.flush_upto = 0.0  # audio seconds received when the pending flush was asked for
        self.closing = False  # the flush requested is the last one (``close``): decode whatever is left
        self.flushes = 0  # completed flushes
        self.waiting_since: float | None = None  # wall time of the oldest audio not yet in a decode request
        self.stats = StreamStats()
        self.arrivals: deque[tuple[float, float]] = deque(maxlen=4096)  # (stream time, wall time) of arrivals
        self._word_start: dict[int, bool] = {}
        self._aligner: Aligner | None = None  # set while ``apply`` runs
        self._unheard: list[np.ndarray] = []  # received, not yet analysed (see ``_listen``)
        self._unheard_s = 0.0

    # --- audio in -------------------------------------------------------------------------------------
    def feed(self, audio: np.ndarray) -> None:
        """Queue received audio. It is analysed (voice activity) later, by the engine's thread (``_listen``):
        a fast sender costs the receiving thread nothing, and VAD never competes with a decode for the CPU."""
        audio = np.asarray(audio, dtype=np.float32)
        self._unheard.append(audio)
        self._unheard_s += len(audio) / SAMPLE_RATE
        self.stats.audio_s += len(audio) / SAMPLE_RATE
        self.arrivals.append((self.stats.audio_s, time.monotonic()))
        if self.waiting_since is None and len(audio):
            self.waiting_since = time.monotonic()

    def _listen(self) -> None:
        """Move queued audio into the buffer, running voice activity detection over it."""
        if not self._unheard:
            return
        audio = np.concatenate(self._unheard)
        self._unheard, self._unheard_s = [], 0.0
        self.audio = np.concatenate([self.audio, audio])
        self.since_decode += len(audio) / SAMPLE_RATE
        if self.vad is not None:
            flags = self.vad(audio)
            chunk_s = VoiceActivity.CHUNK / SAMPLE_RATE
            end = self.start + self.buffer_s
            for i, voiced in enumerate(flags):
                if voiced:
                    self.speech, self.silence_s = True, 0.0
                    self.last_voiced = end - (len(flags) - 1 - i) * chunk_s
                else:
                    self.silence_s += chunk_s
            if not self.speech and not self.committed:  # only silence so far: keep a short pre-roll
                keep = int(self.config.preroll_s * SAMPLE_RATE)
                if len(self.audio) > keep:
                    self._drop(len(self.audio) - keep, decoded=False)
                self.since_decode = 0.0
                self.waiting_since = None

    def flush(self, close: bool = False) -> None:
        """Decode what is buffered to the end (``finalize``; ``close`` when no audio will follow). Requests
        coalesce: one pending flush at a time."""
        self.flush_requested = True
        self.closing = self.closing or close
        self.flush_upto = self.stats.audio_s

    # --- scheduling -----------------------------------------------------------------------------------
    @property
    def buffer_s(self) -> float:
        return len(self.audio) / SAMPLE_RATE

    def due(self, min_step_s: float = 0.0, share: float = 1.0) -> str | None:
        """"final" (decode and commit everything: end of utterance or flush), "window" (the buffer is full:
        commit its first window), "partial" (re-decode: ``share`` of ``step_s`` of new audio, or of ``min_step_s``
        when the engine asks for more under load), or None (nothing to do yet)."""
        self._listen()
        c = self.config
        if self.flush_requested:
            return "final"
        if not self.speech:
            return None
        if self.vad is not None and self.silence_s >= c.end_silence_s:
            return "final"
        if self.buffer_s >= c.max_buffer_s:
            return "window"
        return "partial" if self.since_decode >= share * max(c.step_s, min_step_s) else None

    def settle_flush(self) -> list[Event] | None:
        """Complete a requested flush that needs no decode, returning its events: a buffer without speech is
        skipped; a ``finalize`` of less than ``min_flush_s`` is deferred (its audio stays, to be decoded with
        what follows — a fraction of a second alone is what Whisper hallucinates on). None: decode it."""
        if not self.flush_requested:
            return None
        if self.silent:
            return self._commit_all([], len(self.audio))
        if not self.closing and self.buffer_s < self.config.min_flush_s:
            self.flush_requested = False
            self.flushes += 1
            return []
        return None

    def request(self, kind: str) -> Request:
        """The decode to run now for ``kind`` (from ``due``). A final of more than one window is committed
        window by window first."""
        if kind == "final" and len(self.audio) > N_SAMPLES:
            kind = "window"
        audio = {"partial": self.audio, "window": self.audio[:N_SAMPLES], "final": self.audio[:self._utterance_end()]}[kind]
        hint = self.previous if self.config.use_hint else []
        self.since_decode = 0.0  # audio arriving while this decode runs counts toward the next one
        now = time.monotonic()
        waited = now - self.waiting_since if self.waiting_since is not None else 0.0
        self.waiting_since = None
        context = self.context if kind == "window" else [t for t in self.context if t < self.vocab.eot]
        return Request(audio, context, self.language, self.config.task, list(self.committed), hint,
                       kind, waited, kind == "partial" and self.config.policy == "alignatt")

    @property
    def backlog_s(self) -> float:
        """Audio received but not yet committed or skipped (what a fast sender has queued)."""
        return self.buffer_s + self._unheard_s

    # --- results --------------------------------------------------------------------------------------
    def apply(self, request: Request, result: RowResult, language: str | None = None, reliable: bool = True,
              fallbacks: int = 0, aligner: Aligner | None = None) -> list[Event]:
        """Take a decode's result. ``reliable`` is false when it failed Whisper's hallucination checks even
        after the temperature fallback (``fallbacks`` attempts): such text is never committed from a partial.
        ``aligner`` (streams with ``word_timestamps``) times the words of the finals this result commits."""
        self._aligner = aligner
        try:
            return self._apply(request, result, language, reliable, fallbacks)
        finally:
            self._aligner = None

    def _apply(self, request: Request, result: RowResult, language: str | None, reliable: bool,
               fallbacks: int) -> list[Event]:
        self.stats.decodes += 1
        self.stats.fallbacks += fallbacks
        self.stats.decode.add(result.stats)
        self.language = language or self.language
        cont = result.tokens[len(request.prefix):]
        if nothing_said(result):
            cont = []  # Whisper's no-speech rule
        if fallbacks and not reliable:
            self.context = []  # as Whisper does after a failed window: do not prompt with text that loops
        if request.kind == "final":
            if self._ended_early(cont, len(request.audio)):  # commit what was said, decode the rest again
                return self._commit_window(cont, len(request.audio))
            return self._commit_all(cont, len(request.audio))
        if request.kind == "window":
            return self._commit_window(cont, len(request.audio), cut_off=True)
        if not reliable:
            cont = []
        if self.config.policy == "alignatt":
            agreed = self._supported(cont, len(request.audio))
        else:
            agreed = self._agreement(cont, self.previous)
        events = []
        if agreed:
            if any(t < self.vocab.eot for t in agreed):  # a lone timestamp is committed without an empty final
                events.append(self._final(agreed, end_of_utterance=False))
            self.committed += agreed
        self.previous = cont[len(agreed):]
        events += self._partial_event()
        self._trim()
        return events

    def _commit_all(self, cont: list[int], decoded: int) -> list[Event]:
        """Commit the whole continuation and drop the ``decoded`` samples from the buffer: the utterance
        ended (trailing silence or a flush), or the buffer is full while speech goes on (then
        ``end_of_utterance`` is false). Audio that arrived during the decode stays."""
        ended = True
        events = []
        if cont or self.committed or self.flush_requested:  # every utterance ends with a final
            events.append(self._final(cont, end_of_utterance=ended, decoded=decoded))
        self._add_context(self.committed + cont)
        self._drop(decoded, decoded=bool(self.speech or self.committed))
        self.committed, self.previous, self.partial = [], [], ""
        self.speech = not self.config.vad or self.last_voiced > self.start
        if not self.speech:
            self.silence_s = 0.0
        if ended:
            self.language = self.config.language
        # a flush is done once all it asked for has left the buffer (a decode requested before it covers less)
        if self.flush_requested and self.stats.decoded_s + self.stats.skipped_s >= self.flush_upto - 1e-6:
            self.flushes += 1
            self.flush_requested = False
        self.stats.utterances += 1 if ended else 0
        return events

    def _utterance_end(self) -> int:
        """Where a final ends in the buffer (samples). An utterance ended by trailing silence (no flush) is
        decoded and committed only up to half that silence past the last voiced audio: the rest may hold the
        quiet onset of the next word, which voice detection has not flagged yet. Decoding the audio the final
        commits and nothing more keeps Whisper from ending its text on such an onset ("ask not" came back
        as "is not") or from leaving the tail of a transcribed word to be transcribed again ("country.
        Country.")."""
        if self.vad is None or self.flush_requested or self.last_voiced <= self.start:
            return len(self.audio)
        end = self.last_voiced - self.start + self.config.end_silence_s / 2
        return min(len(self.audio), int(round(end * SAMPLE_RATE)))

    def _ended_early(self, cont: list[int], decoded: int) -> bool:
        """Whether a final decode's text stops (at its last timestamp) well before the speech in the audio it
        heard does: Whisper sometimes ends a window early. Committing the whole buffer would drop the words
        after it; like Whisper's offline loop, which seeks to the last timestamp, the rest is decoded again."""
        every = self.committed + cont
        ends = self._segment_ends(every)
        if not ends:
            return False
        text_end = (every[ends[-1]] - self.vocab.timestamp_begin) * TOKEN_SECONDS
        speech_end = decoded / SAMPLE_RATE if self.vad is None else self.last_voiced - self.start
        return speech_end - text_end >= self.config.unheard_s

    @property
    def silent(self) -> bool:
        """Nothing worth decoding: no speech in the buffer and nothing committed from it."""
        return not self.speech and not self.committed

    def _commit_window(self, cont: list[int], decoded: int, cut_off: bool = False) -> list[Event]:
        """The buffer is full: commit the decoded window up to its last complete segment (the timestamp that
        closes it) and drop only that audio; the rest stays buffered and is decoded again, as Whisper's
        offline loop seeks. Without a segment end, the whole window is committed and dropped. ``cut_off``: the
        window ends inside speech that goes on, so a segment that ends with it is likely cut short ("the art of
        print."): with an aligner, the words the audio supports are committed (:meth:`_commit_words`; a decode
        that ran on past its audio, repeating committed text, is not); else the last segment end at least
        ``window_guard_s`` before the window's end is taken, if any."""
        tb = self.vocab.timestamp_begin
        every = self.committed + cont
        ends = self._segment_ends(every)
        if cut_off and self._aligner is not None and (words := self._aligner([], every)) \
                and (events := self._commit_words(cont, words, decoded)) is not None:
            return events
        if not ends:
            return self._commit_all_window(cont, decoded)
        guard = decoded / SAMPLE_RATE - self.config.window_guard_s
        before = [i for i in ends if (every[i] - tb) * TOKEN_SECONDS <= guard]
        cut = before[-1] if cut_off and before else ends[-1]
        done = len(self.committed)
        events = [self._final(every[done:cut + 1], end_of_utterance=False)] if cut + 1 > done else []
        shift = every[cut] - tb
        self._add_context(every[:cut + 1])
        rebase = lambda ts: [t - shift if t >= tb else t for t in ts]  # noqa: E731
        self.committed = rebase(every[cut + 1:max(cut + 1, done)])
        self.previous = rebase(every[max(cut + 1, done):])
        self._drop(int(round(shift * TOKEN_SECONDS * SAMPLE_RATE)))
        return events + self._partial_event()

    def _commit_words(self, cont: list[int], words: list[Word], decoded: int) -> list[Event] | None:
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
        n = 0
        text_tokens -= done
        while text_tokens > 0 and n < len(cont):
            text_tokens -= cont[n] < self.vocab.eot
            n += 1
        while 0 < n < len(cont) and not self._boundary(cont[n]):
            n += 1  # finish the word (its last tokens may not be text: never cut inside one)
        events = [self._final(cont[:n], end_of_utterance=False, decoded=int(end * SAMPLE_RATE))] if n else []
        self._add_context(self.committed + cont[:n])
        self.committed = []
        self.previous = [self.vocab.timestamp_begin] + [t for t in cont[n:] if t < self.vocab.eot]
        self._drop(int(round(end * SAMPLE_RATE)))
        return events + self._partial_event()

    def _segment_ends(self, tokens: list[int]) -> list[int]:
        """Indices of the timestamps that close a segment (after text, followed by a timestamp or the end)."""
        tb = self.vocab.timestamp_begin
        return [i for i in range(1, len(tokens)) if tokens[i] > tb and tokens[i - 1] < tb
                and (i + 1 == len(tokens) or tokens[i + 1] >= tb)]

    def _commit_all_window(self, cont: list[int], decoded: int) -> list[Event]:
        events = [self._final(cont, end_of_utterance=False, decoded=decoded)] if cont else []
        self._add_context(self.committed + cont)
        self._drop(decoded)
        self.committed, self.previous = [], []
        return events + self._partial_event()

    def _add_context(self, tokens: list[int]) -> None:
        """Append committed tokens to the prompt, timestamps kept. A window commit is prompted with them, as
        Whisper's offline loop prompts a window: prompted with text alone, Whisper answered a full window in
        kind, one timestamp-less run that ended before the window's speech did (and the window committed
        from it lost those words). Re-decodes of a growing buffer are prompted with the text alone: with
        timestamps, a real-time stream of the long-form talk went from 2.8 % to 10.8 % WER against offline."""
        tb = self.vocab.timestamp_begin
        self.context = (self.context + [t for t in tokens if t < self.vocab.eot or t >= tb])[-self.config.max_context:]

    def _drop(self, samples: int, decoded: bool = True) -> None:
        """Remove the first ``samples`` of the buffer (they were decoded, or skipped as silence)."""
        samples = min(samples, len(self.audio))
        self.audio = self.audio[samples:]
        self.start += samples / SAMPLE_RATE
        if decoded:
            self.stats.decoded_s += samples / SAMPLE_RATE
        else:
            self.stats.skipped_s += samples / SAMPLE_RATE

    def _agreement(self, cont: list[int], previous: list[int]) -> list[int]:
        """LocalAgreement-2: the common prefix of two successive continuations, cut back to a word boundary
        (the token after the cut starts a word or is a timestamp)."""
        n = 0
        while n < min(len(cont), len(previous)) and cont[n] == previous[n]:
            n += 1
        while n > 0 and (n >= len(cont) or not self._boundary(cont[n])):
            n -= 1
        return cont[:n]

    def _supported(self, cont: list[int], decoded: int) -> list[int]:
        """AlignAtt: the prefix of ``cont`` the audio already supports. Its words are aligned (the engine's
        aligner: the alignment heads' cross-attention, Whisper's DTW); words are taken while each ends at least
        ``alignatt_margin_s`` before the ``decoded`` audio does, never the last word, and the cut is a word
        boundary; a word the target is unsure of needs ``alignatt_unsure_margin_s``. Without an aligner (or words),
        nothing is committed until the utterance ends."""
        if self._aligner is None or not any(t < self.vocab.eot for t in cont):
            return []
        words = self._aligner(list(self.committed), list(cont))
        c, heard = self.config, decoded / SAMPLE_RATE
        text_tokens = 0
        for w in words[:-1]:
            margin = c.alignatt_margin_s if w.probability >= c.alignatt_min_probability else c.alignatt_unsure_margin_s
            if w.end > heard - margin:
                break
            text_tokens += w.tokens
        n = 0
        while text_tokens > 0 and n < len(cont):
            text_tokens -= cont[n] < self.vocab.eot
            n += 1
        while n > 0 and (n >= len(cont) or not self._boundary(cont[n])):
            n -= 1
        return cont[:n]

    def _boundary(self, token: int) -> bool:
        """Whether a commit may end before ``token``: a timestamp, a token that starts a word (with its space) or
        other non-alphanumeric text, but not closing punctuation, which belongs to the word before it (a final
        never starts with ", produced")."""
        if token >= self.vocab.eot:
            return True
        if token not in self._word_start:
            piece = self.tokenizer.id_to_token(token) or ""
            self._word_start[token] = piece.startswith("Ġ") or not (piece[:1].isalnum() or piece[:1] in APPEND)
        return self._word_start[token]

    def _partial_event(self) -> list[Event]:
        if not self.config.interim:
            return []
        raw = self.tokenizer.decode(self.previous)
        if (text := raw.strip()) == self.partial:
            return []
        self.partial = text
        begin = max(self._time_of_end(self.committed), self.emitted_end)
        return [Event("partial", text, begin, max(begin, self.start + self.buffer_s), join=self._join(raw))]

    def _join(self, raw: str) -> str:
        """A space before text that Whisper's tokens begin with one (not before punctuation, nor in languages
        written without spaces), once the stream has said something."""
        return " " if self.said and raw[:1].isspace() else ""

    def _final(self, tokens: list[int], end_of_utterance: bool, decoded: int | None = None) -> Event:
        """A final for newly committed ``tokens``: text, time span and segments (split at timestamps).
        Without a closing timestamp the span ends where the decoded audio ended (an estimate), and never
        after it; finals never overlap."""
        tb = self.vocab.timestamp_begin
        begin = max(self._time_of_end(self.committed), self.emitted_end)
        closed = bool(tokens) and tokens[-1] >= tb
        heard = self.start + (len(self.audio) if decoded is None else decoded) / SAMPLE_RATE
        end = max(min(self._abs(tokens[-1]), heard) if closed else heard, begin)  # never past the audio decoded
        words = None
        if self._aligner is not None and self.config.word_timestamps:
            words = self._aligner(list(self.committed), list(tokens))
            if words:  # the words time the final better than the decode's estimate: its span follows them
                begin = round(max(self.emitted_end, self.start + words[0].start), 3)
                end = max(begin, round(min(self.start + words[-1].end, heard), 3))
            for w in words:
                w.start = round(min(max(self.start + w.start, begin), end), 3)
                w.end = round(min(max(self.start + w.end, w.start), end), 3)
        segments, start, part = [], begin, []
        for t in tokens + [None]:
            if t is None or t >= tb:
                stop = end if t is None else min(max(self._abs(t), start), end)
                if text := self.tokenizer.decode(part).strip():
                    segments.append(Segment(start, stop, text))
                part, start = [], stop
            else:
                part.append(t)
        raw = self.tokenizer.decode(tokens)
        text, join = raw.strip(), self._join(raw)
        self.said = self.said or bool(text)
        if closed and text:  # latency: now minus when the audio at the final's end arrived
            arrived = next((w for t, w in self.arrivals if t >= end - 1e-6), None)
            if arrived is not None:
                self.stats.final_latency_s.append(time.monotonic() - arrived)
        if end_of_utterance:
            self.partial = ""
        self.emitted_end = end
        return Event("final", text, begin, end, segments, end_of_utterance, words, join)

    def _trim(self) -> None:
        """Cut the buffer after the last committed segment that is closed by a timestamp pair."""
        if self.buffer_s <= self.config.trim_s:
            return
        tb = self.vocab.timestamp_begin
        c = self.committed
        cut = next((i for i in range(len(c) - 2, -1, -1) if c[i] >= tb and c[i + 1] >= tb), None)
        if cut is None:
            return
        shift = c[cut] - tb
        self._add_context(c[:cut + 1])
        rebase = lambda ts: [t - shift if t >= tb else t for t in ts]  # noqa: E731
        self.committed, self.previous = rebase(c[cut + 1:]), rebase(self.previous)
        self._drop(int(round(shift * TOKEN_SECONDS * SAMPLE_RATE)))

    # --- helpers --------------------------------------------------------------------------------------
    def _abs(self, timestamp: int) -> float:
        return self.start + (timestamp - self.vocab.timestamp_begin) * TOKEN_SECONDS

    def _time_of_end(self, tokens: list[int]) -> float:
        stamps = [t for t in tokens if t >= self.vocab.timestamp_begin]
        return self._abs(stamps[-1]) if stamps else self.start
