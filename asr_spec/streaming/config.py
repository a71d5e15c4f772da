"""The settings of a stream (one per session) and of the engine that decodes all streams."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..recognizer import DRAFT_STOP, Checks, EncoderWindow, K
from . import STEP_S
from .policy import AlignAtt, CommitPolicy


class WordTiming(StrEnum):
    """Where AlignAtt's word times come from (serve --alignment): the cross-attention the decode recorded as it chose
    the tokens, or a pass of the target decoder over the text after the decode (Whisper's word alignment)."""
    DECODE = "decode"
    PASS = "pass"


@dataclass(frozen=True)
class StreamConfig:
    language: str | None = "en"  # None: detect at the start of each utterance (multilingual models)
    languages: tuple[str, ...] = ()  # with language None: detect among these only (empty: any)
    task: str = "transcribe"
    interim: bool = True  # send partial results
    step_s: float = STEP_S  # re-decode once this much new audio has arrived (the engine waits longer under load)
    end_silence_s: float = 0.6  # trailing silence that ends an utterance
    trim_s: float = 12.0  # trim the buffer at committed segment ends once it is longer than this
    max_buffer_s: float = 24.0  # a longer buffer is flushed whole (Whisper sees at most 30 s)
    window_guard_s: float = 1.0  # a full buffer is committed up to a word or segment end this long before its end
    vad: bool = True
    vad_threshold: float = 0.5
    # audio kept before the first chunk voice detection flags: Silero flags a soft onset late, and 0.3 s cut first
    # words ('that' -> 'let', 'There's iron' -> 'They desire'); 0.6 s: dev stream 8.13 % against 8.22 %, the long
    # talk the same (eval/results/avx2-current, 'The pre-roll')
    preroll_s: float = 0.6
    use_hint: bool = True  # the previous continuation drafts the next re-decode
    min_flush_s: float = 1.0  # a finalize of a shorter buffer is deferred: decoded with the audio that follows
    max_context: int = 192  # committed tokens kept as the prompt (prompt + prefix stay well under 448)
    unheard_s: float = 1.0  # a final whose text ends this long before speech does is committed only that far
    word_timestamps: bool = False  # finals carry their words with times (Whisper's alignment; the engine adds them)
    hotwords: str = ""  # words to favour, in the prompt before the committed text of every decode (faster-whisper's)
    prompt: str = ""  # text the first decodes are prompted with until text is committed (Whisper's initial_prompt)
    policy: CommitPolicy = AlignAtt()  # what a re-decode commits, with its parameters: AlignAtt or LocalAgreement


@dataclass(frozen=True)
class EngineConfig:
    max_batch: int = 8
    # the draft model also proposes past a stream's hint (its previous hypothesis, always proposed). Off (the
    # default): a CPU's engine spends 10 % less for the same text (eval/results/stream-draft); uploads still draft
    draft: bool = False
    k: int = K
    draft_stop: float = DRAFT_STOP
    # how a stream's buffer is encoded (encoding.py): STREAM (each frame a bounded number of times: the last
    # ``lookahead_s`` of audio and ``pad_s`` of silence again at each step), AUDIO (the whole buffer plus 2 s of
    # silence at each step), FULL (Whisper's padded 30 s window at each step); its name ("audio") will do
    encoder_window: EncoderWindow = EncoderWindow.STREAM
    lookahead_s: float = 2.0
    pad_s: float = 3.0
    alignment: WordTiming = WordTiming.PASS  # where AlignAtt's word times come from; its name ("decode") will do
    # Whisper's hallucination thresholds; a shorter fallback ladder than offline (each step is a full decode)
    checks: Checks = Checks(temperatures=(0.0, 0.4, 0.8))
    # a row holds at most its prefix + 16 + this many tokens per second of its audio (capped at Whisper's 224):
    # speech is 3-7 tokens/s with timestamps, so only a loop reaches it, and a loop on a short piece costs
    # what the piece is worth instead of 224 tokens at every temperature
    tokens_per_s: float = 16.0
    # the step grows with the load: a stream is due once it has this many times the engine's recent step time of
    # new audio (so that decoding takes about this share of the time), between its own step_s and max_step_s
    target_busy: float = 0.7
    # 0: off, every stream re-decodes after its own step, and decodes do not depend on the machine's speed (serve: 3 s)
    max_step_s: float = 0.0
    # a batch that decodes anyway takes along the streams with at least this share of their step of new audio: a row
    # added to a batch costs far less than a batch of its own later (the passes are shared), and the streams fall
    # into step with each other, so that later batches are full too (1: only streams that are due)
    join_share: float = 0.5
    # the engine's cost per second of audio (Engine.cost: what admission by load reads) is measured over this window,
    # once it has taken in at least this much audio
    load_window_s: float = 30.0
    load_min_audio_s: float = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoder_window", EncoderWindow(self.encoder_window))
        object.__setattr__(self, "alignment", WordTiming(self.alignment))
