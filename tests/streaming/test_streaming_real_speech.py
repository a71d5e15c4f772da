"""The streaming engine on real speech: a long stream is trimmed (bounded buffer) and still gives the offline text."""
from __future__ import annotations

import json

import jiwer
import numpy as np
import pytest
from conftest import DEV
from whisper_normalizer.english import EnglishTextNormalizer

from asr_spec.audio import load_audio
from asr_spec.decoding.rows import RowResult, RowStats
from asr_spec.models.loader import default_draft, load_draft
from asr_spec.streaming.config import StreamConfig
from asr_spec.streaming.engine import Engine, stream_audio, stream_pieces
from asr_spec.transcribe import TranscribeOptions, Transcriber

pytestmark = pytest.mark.slow  # a real server, browser, subprocess or real weights

normalize = EnglishTextNormalizer()


@pytest.fixture(scope="module")
def transcriber(base_model):
    return Transcriber(base_model, load_draft(default_draft("whisper-base"), base_model))


def test_a_long_stream_is_trimmed_and_matches_the_offline_transcript(transcriber):
    meta = json.loads((DEV / "longform" / "manifest.jsonl").read_text().splitlines()[0])
    audio = load_audio(DEV / "longform" / meta["audio"])[: 75 * 16000]
    engine = Engine(transcriber)
    buffers, stats = [], []
    orig_step = engine.step

    def step():
        buffers.extend(s["backlog_seconds"] for s in engine.snapshot())
        return orig_step()

    engine.step = step
    events = stream_audio(engine, audio, StreamConfig(), stats=stats)
    streamed = " ".join(e.text for e in events if e.type == "final" and e.text)
    offline = transcriber.transcribe(audio, TranscribeOptions(language="en")).text
    wer = jiwer.wer(normalize(offline), normalize(streamed))
    print(f"streamed vs offline WER {wer:.3f}; longest buffer {max(buffers):.1f} s; {stats[0].as_dict()}")
    assert max(buffers) <= StreamConfig.max_buffer_s + 1.5  # bounded, though the talk has few long pauses
    finals = [e for e in events if e.type == "final"]
    assert any(not e.end_of_utterance for e in finals) and finals[-1].end_of_utterance
    assert all(a.end <= b.start + 1e-6 for a, b in zip(finals, finals[1:]))
    assert all(e.text or e.end_of_utterance for e in finals)  # only an utterance's end may be an empty final
    assert stats[0].decode.hint_accepted > 0  # re-decodes verified the previous hypothesis for free
    assert wer <= 0.05, (offline, streamed)


def test_windows_committed_after_a_prompt_keep_their_timestamps_and_words(transcriber):
    """A fast sender fills the buffer, so the stream commits 30 s windows one after another, each prompted with
    the text before it. The prompt keeps its timestamps (as Whisper's does): prompted with text alone, the
    second window came back as one timestamp-less run that ended at "freer hand." and the whole window was
    committed, losing the rest of its speech."""
    meta = json.loads((DEV / "longform" / "manifest.jsonl").read_text().splitlines()[0])
    audio = load_audio(DEV / "longform" / meta["audio"])[: 70 * 16000]
    events = stream_audio(Engine(transcriber), audio, StreamConfig(), chunk_s=40.0)
    finals = [e for e in events if e.type == "final" and e.text]
    print([(round(e.start, 2), round(e.end, 2), len(e.segments)) for e in finals])
    assert len(finals) >= 2 and all(len(e.segments) >= 3 for e in finals[:2])  # timestamps in every window
    offline = transcriber.transcribe(audio, TranscribeOptions(language="en")).text
    streamed = " ".join(e.text for e in finals)
    assert jiwer.wer(normalize(offline), normalize(streamed)) <= 0.05, (offline, streamed)


def test_finals_carry_their_words_timed_like_the_offline_words(transcriber):
    """With ``word_timestamps`` every final with text carries its words (its own, none of an earlier final's),
    in order and inside the final's span, at about the times offline word timestamps give the same audio."""
    import difflib

    meta = json.loads((DEV / "longform" / "manifest.jsonl").read_text().splitlines()[0])
    audio = load_audio(DEV / "longform" / meta["audio"])[: 45 * 16000]
    events = stream_audio(Engine(transcriber), audio, StreamConfig(word_timestamps=True))
    finals = [e for e in events if e.type == "final" and e.text]
    assert len(finals) >= 3
    streamed = []
    for e in finals:
        assert e.words, e
        assert " ".join(w.word.strip() for w in e.words).split() == e.text.split(), e
        assert all(e.start <= w.start <= w.end <= e.end for w in e.words), e
        assert all(a.start <= b.start for a, b in zip(e.words, e.words[1:])), e
        assert json.loads(json.dumps(e.as_dict()))["words"][0].keys() == {"word", "start", "end", "probability"}
        streamed += e.words
    assert all(a.start <= b.start for a, b in zip(streamed, streamed[1:]))
    offline = [w for s in transcriber.transcribe(audio, TranscribeOptions(language="en", word_timestamps=True)).segments
               for w in s.words]
    key = lambda ws: [normalize(w.word) for w in ws]  # noqa: E731
    pairs = [(streamed[m.a + i], offline[m.b + i])
             for m in difflib.SequenceMatcher(None, key(streamed), key(offline), autojunk=False).get_matching_blocks()
             for i in range(m.size)]
    gaps = sorted(abs(a.start - b.start) for a, b in pairs)
    print(f"{len(streamed)} streamed words, {len(offline)} offline, {len(pairs)} paired; |start difference| "
          f"median {np.median(gaps):.3f} s, p90 {gaps[int(0.9 * len(gaps))]:.3f} s")
    assert len(pairs) >= 0.9 * len(offline)
    assert np.median(gaps) <= 0.2
    without = [e for e in stream_audio(Engine(transcriber), audio[: 8 * 16000], StreamConfig()) if e.type == "final"]
    assert all(e.words is None and "words" not in e.as_dict() for e in without)


def test_silence_is_skipped_without_decoding(transcriber):
    engine = Engine(transcriber)
    quiet = np.random.default_rng(0).normal(0, 1e-3, 10 * 16000).astype(np.float32)
    stats = []
    events = stream_audio(engine, quiet, StreamConfig(), stats=stats)
    assert stats[0].decodes == 0 and all(not e.text for e in events)


def test_voice_activity_detection_leaves_torch_threads_alone():
    import torch

    from asr_spec.vad import VoiceActivity

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        vad = VoiceActivity()
        speech = load_audio(DEV / "jfk-inaugural-1961-ask-not.wav")[16000:48000]
        flags = vad(np.concatenate([np.zeros(16000, np.float32), speech]))
        assert torch.get_num_threads() == 2  # loading Silero's TorchScript model used to drop it to 1
        assert not any(flags[:25]) and sum(flags[40:]) > 20  # silence, then speech
    finally:
        torch.set_num_threads(before)


def test_a_decode_that_runs_past_its_audio_is_decoded_again_on_a_full_window(transcriber):
    """Dev utterances back to back (30.7 s, sent at once): the last 2 s, encoded at their own length, made the
    decoder loop ("printing beautiful letters," x4, timestamps up to 25 s) — such a row is decoded again on
    Whisper's padded 30 s window, so the stream ends with the offline transcript's words."""
    items = [json.loads(x) for x in (DEV / "manifest.jsonl").read_text().splitlines()]
    pause = np.zeros(int(0.4 * 16000), np.float32)
    parts = []
    for item in items[9:]:
        parts += [load_audio(DEV / item["audio"]), pause]
        if sum(map(len, parts)) >= 25 * 16000:
            break
    audio = np.concatenate(parts)
    offline = transcriber.transcribe(audio, TranscribeOptions(language="en")).text
    stats: list = []
    events = stream_audio(Engine(transcriber), audio, StreamConfig(language="en"), chunk_s=len(audio) / 16000, stats=stats)
    finals = [e for e in events if e.type == "final" and e.text]
    streamed = " ".join(e.text for e in finals)
    print(f"{len(audio) / 16000:.1f} s; {stats[0].as_dict()}; {streamed!r}")
    assert finals[-1].end <= len(audio) / 16000 + 0.5
    assert jiwer.wer(normalize(offline), normalize(streamed)) <= 0.05, (offline, streamed)


def test_a_looped_or_overrunning_decode_is_suspect(transcriber):
    tb, encode = transcriber.vocab.timestamp_begin, transcriber.target.tokenizer.encode
    phrase = encode(" which are an exact imitation,")

    def row(tokens: list[int]) -> RowResult:
        return RowResult(tokens, -0.1 * len(tokens), 0.0, RowStats())

    said = encode(" in letters which are an exact imitation.")
    assert not transcriber.suspect(row([tb] + said + [tb + 150]), positions=250)
    assert transcriber.suspect(row([tb] + said + [tb + 300]), positions=250)  # a timestamp past the audio
    assert transcriber.suspect(row([tb] + phrase * 2), positions=250)  # a phrase repeated at once
    assert not transcriber.suspect(row([tb] + phrase + encode(" and") + phrase), positions=250)


def test_an_utterance_ended_by_silence_decodes_only_what_it_commits(transcriber):
    """The JFK clip's first 3.3 s end in the pause after "Americans" plus the quiet onset of "ask", which voice
    detection does not flag. The final of that utterance is decoded only up to half the silence past the last
    voiced audio: decoded to the end of the buffer, Whisper closed its text at 3.0 s, on the onset, and the next
    utterance came back as "is not" (and a word's tail left behind came back as a second "Country.")."""
    audio = load_audio(DEV / "jfk-inaugural-1961-ask-not.wav")
    cuts = [0, int(3.304 * 16000)] + list(range(int(5.104 * 16000), len(audio), 2 * 16000)) + [len(audio)]
    events = stream_pieces(Engine(transcriber), [[audio[a:b] for a, b in zip(cuts, cuts[1:])]])[0]
    finals = [e for e in events if e.type == "final" and e.text]
    print([(e.start, e.end, e.text) for e in finals])
    assert finals[0].end < 3.0  # the first utterance ends inside the pause
    offline = transcriber.transcribe(audio, TranscribeOptions(language="en")).text
    assert normalize(" ".join(e.text for e in finals)) == normalize(offline)


def test_a_final_that_says_words_after_its_audio_is_decoded_again_on_a_full_window(transcriber):
    """The last 7 s of the talk's first 75 s, cut inside a sentence and flushed: encoded at their length (the streaming
    encoder), Whisper ended them with words nobody said ("the letter used should be for the letter.", the last
    words aligned to the audio's last frame). Such a final is decoded again on Whisper's padded 30 s window, so it
    says what that window hears, and none of its words starts after the audio."""
    from asr_spec.alignment import align
    from asr_spec.recognizer import EncoderWindow
    from asr_spec.streaming.config import EngineConfig
    from asr_spec.streaming.decode import RAN_PAST_S, decode_batch
    from asr_spec.streaming.encoding import BufferEncoder, encode_whole
    from asr_spec.streaming.request import RequestKind, StreamRequest

    meta = json.loads((DEV / "longform" / "manifest.jsonl").read_text().splitlines()[0])
    audio = load_audio(DEV / "longform" / meta["audio"])[68 * 16000: 75 * 16000]

    def final(window: EncoderWindow):
        encoder = BufferEncoder(transcriber, 2.0, 3.0) if window is EncoderWindow.STREAM else None
        request = StreamRequest(audio, 68.0, [], "en", "transcribe", [], [], RequestKind.FINAL, encoder=encoder)
        return decode_batch(transcriber, [request], EngineConfig(encoder_window=window))[0]

    streamed, padded = final(EncoderWindow.STREAM), final(EncoderWindow.FULL)
    tokens = streamed.result.tokens
    text = transcriber.target.tokenizer.decode([t for t in tokens if t < transcriber.vocab.eot])
    print(repr(text), streamed.fallbacks)
    assert tokens == padded.result.tokens and streamed.fallbacks == 1
    words = align(transcriber.target, encode_whole(transcriber, audio, full=True).memory, len(audio) // 160, "en",
                  "transcribe", [tokens])[0]
    assert words and all(w.start < len(audio) / 16000 - RAN_PAST_S for w in words), words
