"""A stream's commits and events, driven by hand-made decode results (fast: the tiny model's real tokenizer, no
weights): what a final commits and leaves in the buffer, how finals join, what each policy commits."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import DEV

from asr_spec.alignment import Word
from asr_spec.audio import load_audio
from asr_spec.decoding.rows import RowResult, RowStats
from asr_spec.streaming.config import StreamConfig
from asr_spec.streaming.policy import AlignAtt, LocalAgreement
from asr_spec.streaming.request import Decoded, RequestKind
from asr_spec.streaming.stream import Stream, listen


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    return tiny_target.tokenizer


def _stream(tokenizer, seconds: float, close: bool = False, **config) -> Stream:
    s = Stream(StreamConfig(vad=False, **config), tokenizer)
    s.feed(np.zeros(int(seconds * 16000), np.float32))
    if close:
        s.flush(close=True)
    listen([s])
    return s


def _result(tokens: list[int]) -> RowResult:
    return RowResult(tokens, -0.1 * (len(tokens) + 1), 0.0, RowStats())


def _aligner(tokenizer, ends: dict[str, float], unsure: str = ""):
    def words(before: list[int], tokens: list[int]) -> list[Word]:
        return [Word(w, e - 0.3, e, 0.75 if w == unsure else 0.9, len(tokenizer.encode(w))) for w, e in ends.items()]
    return words


def test_a_final_whose_text_ends_early_commits_only_what_was_said(tokenizer):
    """A final decode that stops (its last timestamp) a second or more before the audio it heard ends commits
    up to that timestamp and decodes the rest again, instead of dropping the words after it (8 fast senders:
    a 28.8 s stream lost "in letters which are an exact imitation" at its end)."""
    tb = tokenizer.vocab.timestamp_begin
    said = tokenizer.encode(" The aforesaid Gutenberg Bible is printed")
    s = _stream(tokenizer, 20, close=True)
    assert s.due() is RequestKind.FINAL
    events = s.apply(s.request(RequestKind.FINAL), Decoded(_result([tb] + said + [tb + 250])))  # ends at 5 s
    assert [e.text for e in events if e.type == "final"] == ["The aforesaid Gutenberg Bible is printed"]
    assert s.intake.start == pytest.approx(5.0) and s.intake.buffer_s == pytest.approx(15.0) and s.flushes == 0
    assert s.due() is RequestKind.FINAL  # the other 15 s are decoded again
    s.apply(s.request(RequestKind.FINAL), Decoded(_result([])))
    assert s.intake.buffer_s == 0 and s.flushes == 1 and s.stats.decoded_s == pytest.approx(20.0)

    s = _stream(tokenizer, 20, close=True)  # text to within a second of the end: everything is committed at once
    s.apply(s.request(RequestKind.FINAL), Decoded(_result([tb] + said + [tb + 975])))
    assert s.intake.buffer_s == 0 and s.flushes == 1

    # ... unless it ends on a timestamp pair (the next segment begun, then cut by the window's end): decoded again from
    # it, as Whisper's loop seeks (a fast sender's 29.4 s final so ended 0.92 s early and lost "and France.")
    s = _stream(tokenizer, 20, close=True)
    s.apply(s.request(RequestKind.FINAL), Decoded(_result([tb] + said + [tb + 975, tb + 975])))
    assert s.intake.start == pytest.approx(19.5) and s.flushes == 0 and s.due() is RequestKind.FINAL


def test_a_final_whose_words_end_early_decodes_the_rest_again(tokenizer):
    """A final decode whose last segment is closed at the end of the audio but whose aligned words end long before
    (Whisper stretched "bravely trudged on alone." over 12 s, and the sentence after it was never decoded: 8 fast
    senders, a stream 64 % WER against offline's 40 %) commits its words, drops the audio up to the last word's end,
    and decodes the rest again, as Whisper's offline loop seeks with word timestamps. Words that reach to within
    ``unheard_s`` of the end, or a decode without aligned words, commit everything at once."""
    tb = tokenizer.vocab.timestamp_begin
    said = tokenizer.encode(" bravely trudged on alone.")
    tokens = [tb] + said + [tb + 625]  # one segment closed at 12.5 s of the 13 s heard
    s = _stream(tokenizer, 13, close=True)
    events = s.apply(s.request(RequestKind.FINAL), Decoded(_result(tokens),
                                                           aligner=_aligner(tokenizer, {" bravely trudged on": 1.2,
                                                                                        " alone.": 1.6})))
    finals = [e for e in events if e.type == "final"]
    assert [e.text for e in finals] == ["bravely trudged on alone."] and finals[0].end == pytest.approx(1.6)
    assert not finals[0].end_of_utterance
    assert s.intake.start == pytest.approx(1.6) and s.intake.buffer_s == pytest.approx(11.4) and s.flushes == 0
    assert s.due() is RequestKind.FINAL  # the other 11.4 s are decoded again, prompted with the words committed
    request = s.request(RequestKind.FINAL)
    assert request.prefix == [] and tokenizer.decode(request.context).strip() == "bravely trudged on alone."
    s.apply(request, Decoded(_result([])))
    assert s.intake.buffer_s == 0 and s.flushes == 1 and s.stats.decoded_s == pytest.approx(13.0)

    for aligner in (_aligner(tokenizer, {" bravely trudged on": 11.0, " alone.": 12.2}), None):
        s = _stream(tokenizer, 13, close=True)
        s.apply(s.request(RequestKind.FINAL), Decoded(_result(tokens), aligner=aligner))
        assert s.intake.buffer_s == 0 and s.flushes == 1


def test_a_final_keeps_only_the_words_its_audio_holds(tokenizer):
    """A final decode that says its last sentence again, the copy's words aligned on one frame (a fast sender's last
    3.7 s at int8: "... in Germany and France. Not only in Italy, but in Germany and France.", the stream +13 WER points
    over offline), commits the words before the copy; the audio after them is decoded again as usual (here it ends
    ``unheard_s`` or more after them), prompted with them."""
    tb = tokenizer.vocab.timestamp_begin
    sentence = " not only in Italy, but in Germany and France."
    tokens = [tb] + tokenizer.encode(sentence) + tokenizer.encode(" Not" + sentence[4:]) + [tb + 200]
    first = sentence.split(" ")[1:]

    def aligner(before: list[int], toks: list[int]) -> list[Word]:
        said = [Word(" " + w, 0.3 * i, 0.3 * i + 0.28, 0.95, len(tokenizer.encode(" " + w))) for i, w in enumerate(first)]
        return said + [Word(w.word.replace(" not", " Not"), 2.5, 2.5, 0.99, w.tokens) for w in said]

    s = _stream(tokenizer, 4.0, close=True)
    events = s.apply(s.request(RequestKind.FINAL), Decoded(_result(tokens), aligner=aligner))
    finals = [e for e in events if e.type == "final"]
    assert [e.text for e in finals] == [sentence.strip()] and finals[0].end == pytest.approx(2.68)
    assert s.intake.buffer_s == pytest.approx(4.0 - 2.68) and s.due() is RequestKind.FINAL
    request = s.request(RequestKind.FINAL)
    assert tokenizer.decode(request.context).strip() == sentence.strip()
    s.apply(request, Decoded(_result([])))
    assert s.intake.buffer_s == 0 and s.flushes == 1 and s.stats.decoded_s == pytest.approx(4.0)


def test_finals_say_how_they_join_the_text_before_them(tokenizer):
    """A final that begins with punctuation joins the previous one without a space ("movable type, the", not
    "movable type , the"); the first final and text in a new sentence say so too."""
    tb = tokenizer.vocab.timestamp_begin
    s = _stream(tokenizer, 20, close=True)
    finals = []
    for text, end in ((" movable type", 100), (", the press", 200), (" And so it began.", 300)):
        assert s.due() is RequestKind.FINAL
        finals += [e for e in s.apply(s.request(RequestKind.FINAL), Decoded(_result([tb] + tokenizer.encode(text) + [tb + end])))
                   if e.type == "final"]
    assert [(e.join, e.text) for e in finals] == [("", "movable type"), ("", ", the press"), (" ", "And so it began.")]
    assert "".join(e.join + e.text for e in finals) == "movable type, the press And so it began."
    assert all("join" in e.as_dict() for e in finals)


def test_alignatt_commits_the_words_the_audio_already_supports(tokenizer):
    """One decode commits the words whose aligned audio ends at least the margin before the decoded audio does,
    never the last word; the rest is the partial and the next decode's hint. LocalAgreement commits nothing
    from a first decode, and what two decodes agree on from a second."""
    tb = tokenizer.vocab.timestamp_begin
    said = tokenizer.encode(" ask not what your country")
    aligner = _aligner(tokenizer, {" ask": 0.5, " not": 1.0, " what": 1.6, " your": 2.7, " country": 2.9})
    for policy, committed in ((AlignAtt(margin_s=0.5), "ask not what"), (LocalAgreement(), "")):
        s = _stream(tokenizer, 3, policy=policy)
        assert s.due() is RequestKind.PARTIAL
        events = s.apply(s.request(RequestKind.PARTIAL), Decoded(_result([tb] + said), aligner=aligner))
        finals = [e.text for e in events if e.type == "final"]
        assert finals == ([committed] if committed else []), (policy, finals)
        assert tokenizer.decode(s.previous).strip() == ("your country" if committed else "ask not what your country")
        assert [e.text for e in events if e.type == "partial"] == [tokenizer.decode(s.previous).strip()]
    s.feed(np.zeros(8000, np.float32))
    listen([s])
    events = s.apply(s.request(RequestKind.PARTIAL), Decoded(_result([tb] + tokenizer.encode(" ask not what you can"))))
    assert [e.text for e in events if e.type == "final"] == ["ask not what"]  # agreed with the first decode


def test_alignatt_waits_longer_for_a_word_it_is_unsure_of(tokenizer):
    """A word the target is unsure of (probability below 0.8) is committed only once 3 s of audio follow it, and
    nothing after it before that: Whisper's early mistakes ("their" for "there") are such words. Commits never
    end before closing punctuation."""
    tb = tokenizer.vocab.timestamp_begin
    said = tokenizer.encode(" ask not, what your country")
    ends = {" ask": 0.5, " not,": 1.0, " what": 1.6, " your": 2.7, " country": 2.9}

    def run(seconds: float, unsure: str) -> list[str]:
        s = _stream(tokenizer, seconds, policy=AlignAtt(margin_s=0.5, unsure_margin_s=3.0))
        assert s.due() is RequestKind.PARTIAL
        events = s.apply(s.request(RequestKind.PARTIAL), Decoded(_result([tb] + said), aligner=_aligner(tokenizer, ends, unsure)))
        return [e.text for e in events if e.type == "final"]

    assert run(3.0, "") == ["ask not, what"]
    assert run(3.0, " not,") == ["ask"]  # "not," ends 2.0 s before the audio does: not yet
    assert run(4.0, " not,") == ["ask not, what your"]  # 3 s after it: committed, and what the margin allows after it
    assert run(3.0, " ask") == []
    b = _stream(tokenizer, 1).boundaries
    comma, what = tokenizer.encode(",")[0], tokenizer.encode(" what")[0]
    assert not b.before(comma) and b.before(what) and b.before(tb)


def test_a_full_buffer_cut_inside_speech_is_committed_up_to_a_word_end(tokenizer):
    """A 24 s buffer whose decode ends in one segment closed at the buffer's end (speech goes on: its last word is
    likely cut short) is committed up to the last aligned word ending 1 s before the end, and only that audio
    leaves the buffer; the rest is decoded again."""
    tb = tokenizer.vocab.timestamp_begin
    words = [f" w{i}" for i in range(12)]
    tokens = [tb] + [t for w in words for t in tokenizer.encode(w)] + [tb + 1200]  # one segment, 0-24 s

    def aligner(before: list[int], toks: list[int]) -> list[Word]:
        return [Word(w, 2.0 * i, 2.0 * i + 1.9, 0.9, len(tokenizer.encode(w))) for i, w in enumerate(words)]

    s = _stream(tokenizer, 24)
    assert s.due() is RequestKind.WINDOW
    events = s.apply(s.request(RequestKind.WINDOW), Decoded(_result(tokens), aligner=aligner))
    finals = [e for e in events if e.type == "final"]
    assert [e.text for e in finals] == [" ".join(w.strip() for w in words[:11])]  # w11 ends at 23.9 s: kept
    assert s.intake.start == pytest.approx(21.9) and s.intake.buffer_s == pytest.approx(2.1)
    assert s.stats.decoded_s == pytest.approx(21.9)
    assert tokenizer.decode([t for t in s.previous if t < tokenizer.vocab.eot]).strip() == "w11"


def test_a_long_buffer_is_trimmed_at_a_committed_segment_end(tokenizer):
    """Past ``trim_s``, the buffer loses its audio up to the last committed segment end (a timestamp pair): that
    text becomes the prompt, the timestamps after it move with the buffer's start, and nothing is said twice."""
    tb = tokenizer.vocab.timestamp_begin
    first, second = tokenizer.encode(" One sentence."), tokenizer.encode(" And then more")
    s = _stream(tokenizer, 13, policy=LocalAgreement())
    tokens = [tb] + first + [tb + 300, tb + 300] + second
    for _ in range(2):  # the second decode agrees with the first: committed up to " more"'s start
        events = s.apply(s.request(RequestKind.PARTIAL), Decoded(_result(tokens)))
    assert [e.text for e in events if e.type == "final"] == ["One sentence. And then"]
    assert s.intake.start == pytest.approx(6.0) and s.intake.buffer_s == pytest.approx(7.0)
    assert s.context[-len(first) - 1:] == first + [tb + 300]
    assert s.committed == [tb] + second[:-1] and s.previous == second[-1:]


def test_every_sample_leaves_the_buffer_once(tokenizer):
    """Silence before speech is skipped (a pre-roll kept), decoded audio leaves with its final: the statistics
    account for every second received."""
    s = Stream(StreamConfig(), tokenizer)
    s.feed(np.zeros(3 * 16000, np.float32))
    listen([s])
    assert s.due() is None and s.intake.buffer_s == pytest.approx(StreamConfig().preroll_s, abs=0.04)
    s.flush(close=True)
    assert s.due() is RequestKind.FINAL
    (final,) = s.settle_flush()  # no decode; the utterance still ends with a final
    assert final.type == "final" and final.text == "" and final.end_of_utterance
    assert s.stats.skipped_s == pytest.approx(3.0) and s.stats.decoded_s == 0 and s.flushes == 1


def test_a_close_waits_for_the_audio_sent_before_it(tokenizer):
    """The last frame and ``close`` can arrive between the engine's voice detection and its decode (the server's
    receiving thread feeds while the engine's thread works). The final then waits for that frame: decoded without
    it, the frame was left to be decoded alone after the final, and Whisper answered a tenth of a second of the JFK
    clip's end with " you" (CI) or with the prompt again ("can do for you, ask")."""
    s = _stream(tokenizer, 2.0)
    s.feed(np.zeros(1600, np.float32))  # 0.1 s received, not yet listened to
    s.flush(close=True)
    assert s.due() is not RequestKind.FINAL
    listen([s])
    assert s.due() is RequestKind.FINAL and len(s.request(RequestKind.FINAL).audio) == 2.1 * 16000
    s.apply(s.request(RequestKind.FINAL), Decoded(_result([])))
    assert s.flushes == 1 and s.intake.buffer_s == 0 and s.due() is None


def test_a_streams_hotwords_go_with_every_decode_it_asks_for(tokenizer):
    """``StreamConfig.hotwords`` (serve --hotwords, a start message's ``hotwords``): each request carries their
    tokens for the prompt (streaming/decode.py puts them before the context); none without."""
    s = _stream(tokenizer, 3.0, close=True, hotwords="  Lübeck, Basel ")
    assert s.request(RequestKind.PARTIAL).hotwords == s.request(RequestKind.FINAL).hotwords == tokenizer.encode(" Lübeck, Basel")
    assert _stream(tokenizer, 3.0).request(RequestKind.PARTIAL).hotwords == []
    assert _stream(tokenizer, 3.0, language=None, languages=("de", "fr")).request(RequestKind.PARTIAL).languages == ("de", "fr")
    prompted = _stream(tokenizer, 3.0, prompt=" Printing, in the only sense ")  # the first prompt: initial_prompt
    assert prompted.request(RequestKind.PARTIAL).context == tokenizer.encode(" Printing, in the only sense")


@pytest.mark.parametrize("pieces_s", [[0.1], [0.37, 1.3, 0.05, 2.9], [30.0]])
def test_the_buffer_does_not_depend_on_how_the_audio_arrived(tokenizer, pieces_s):
    """Real speech after 0.55 s of silence, fed in pieces of these lengths (in turn, then repeating the last) with the
    engine's ``listen`` after each: the buffer keeps the pre-roll before the first voiced chunk, and the last voiced
    time is that chunk's, the same samples and times as for the audio in 0.1 s pieces (a sender's chunking, or a
    busy engine taking in a backlog at once, must not change what is decoded)."""
    items = {json.loads(x)["id"]: json.loads(x) for x in (DEV / "manifest.jsonl").read_text().splitlines()}
    audio = load_audio(DEV / items["2961-961-0004"]["audio"])[:6 * 16000]

    def fed(lengths: list[float]) -> Stream:
        s, at, i = Stream(StreamConfig(preroll_s=0.3), tokenizer), 0, 0  # shorter than the silence before speech
        while at < len(audio):
            n = int(lengths[min(i, len(lengths) - 1)] * 16000)
            s.feed(audio[at:at + n])
            listen([s])
            at, i = at + n, i + 1
        return s

    want, got = fed([0.1]).intake, fed(pieces_s).intake
    assert want.speech and want.dropped > 0  # speech found; leading silence skipped
    assert (got.dropped, got.last_voiced, got.silence_s) == (want.dropped, want.last_voiced, want.silence_s)
    assert got.since_decode == pytest.approx(want.since_decode) and got.since_decode < got.buffer_s  # from the onset
    assert np.array_equal(got.audio, want.audio)
    assert got.stats.skipped_s + got.buffer_s == pytest.approx(6.0)
