"""The streaming benchmarks' pure parts (eval/benchkit/streaming.py, used by eval/bench_streaming.py and
bench_realtime.py): per-word latency from an event log and offline word times, words missing, the capacity summary."""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
from benchkit import streaming as bench


def partial(text: str, join: str = " ") -> dict:
    return {"type": "partial", "text": text, "join": join}


def final(text: str, join: str = " ") -> dict:
    return {"type": "final", "text": text, "join": join}


def word(text: str, start: float, end: float) -> SimpleNamespace:
    return SimpleNamespace(word=text, start=start, end=end)


def test_partial_then_final_latency():
    offline = [bench.TimedWord("hello", 0.9, 0.5)]
    log = [(0.5, {"type": "ready"}), (1.2, partial("Hello", "")), (2.0, final("Hello.", "")), (2.5, {"type": "closed"})]
    lat = bench.word_latencies(log, offline)
    assert lat["partial_latency"] == [pytest.approx(0.3)]
    assert lat["final_latency"] == [pytest.approx(1.1)]
    assert lat["partial_latency_linear"] == [pytest.approx(0.7)]  # the old yardstick, beside it
    assert lat["final_latency_linear"] == [pytest.approx(1.5)]


def test_final_beginning_with_punctuation_and_a_changing_partial():
    log = [(1.0, partial("so my", "")), (1.5, final("So my", "")), (2.0, partial("fellow", " ")),
           (2.5, partial("fellow Americans", " ")), (3.0, final(", fellow Americans", "")), (3.2, partial("ask", " "))]
    committed, first, final_at = bench.streamed_words(log)
    assert committed == ["so", "my", "fellow", "americans"]
    assert first == [1.0, 1.0, 2.0, 2.5]
    assert final_at == [1.5, 1.5, 3.0, 3.0]


def test_final_continuing_the_last_word_commits_it_anew():
    committed, first, final_at = bench.streamed_words([(1.0, final("hel", "")), (2.0, final("lo there", ""))])
    assert committed == ["hello", "there"]
    assert final_at == [2.0, 2.0]
    assert first == [2.0, 2.0]


def test_only_words_matching_the_offline_transcript_are_timed():
    offline = [bench.TimedWord(w, end, end) for w, end in (("ask", 1.0), ("not", 1.5), ("what", 2.0))]
    lat = bench.word_latencies([(2.5, final("Ask nought what", ""))], offline)
    assert lat["final_latency"] == [pytest.approx(1.5), pytest.approx(0.5)]


def test_words_missing():
    offline = "and so my fellow americans ask not".split()
    assert bench.missing_words(offline, offline) == 0
    assert bench.missing_words(offline, "and so my fellow americans".split()) == 2  # the end never came
    assert bench.missing_words(offline, "and so my yellow americans ask not".split()) == 0  # a substitution
    assert bench.missing_words(offline, "and so my americano ask not".split()) == 1  # two words became one
    assert bench.missing_words(offline, "and so my fellow americans ask not please".split()) == 0


def test_timed_words_from_word_timestamps_and_linear_estimate():
    seg = SimpleNamespace(start=1.0, end=3.0, words=[word(" Hi,", 1.0, 1.4), word(" U.S.", 1.5, 2.2),
                                                     word(" team", 2.3, 2.9)])
    timed = bench.timed_words([seg, SimpleNamespace(start=3.0, end=4.0, words=None)])
    assert [w.word for w in timed] == ["hi", "u", "s", "team"]
    assert [w.end for w in timed] == [1.4, 2.2, 2.2, 2.9]
    assert [w.end_linear for w in timed] == pytest.approx([1.0 + 2 * 2 / 8, 1.0 + 2 * 3 / 8, 1.0 + 2 * 4 / 8, 3.0])


def test_largest_real_time():
    rows = [{"sessions": 1, "rtf": 0.3, "final_latency_median_s": 0.9},
            {"sessions": 4, "rtf": 0.8, "final_latency_median_s": 2.5},
            {"sessions": 8, "rtf": 0.95, "final_latency_median_s": 4.0},
            {"sessions": 10, "rtf": 1.2, "final_latency_median_s": 2.0}]
    assert bench.largest_real_time(rows) == 4
    assert bench.largest_real_time([{"sessions": 1, "rtf": 0.3, "final_latency_median_s": None}]) is None


def test_engine_probe_splits_the_inference_threads_time():
    engine = SimpleNamespace(poll=lambda: (time.sleep(0.01), bool(due))[1], step=lambda: time.sleep(0.05) or {})
    probe = bench.EngineProbe(engine)
    due = [1]
    engine.poll()  # due: the next gap is idle while a stream waits
    time.sleep(0.04)
    engine.step()
    time.sleep(0.02)  # after a step: still work waiting
    due.clear()
    engine.poll()  # nothing due: the next gap is idle
    time.sleep(0.08)
    engine.poll()
    assert probe.idle_due_s == pytest.approx(0.06, abs=0.02)
    assert probe.idle_s == pytest.approx(0.08, abs=0.02)
    assert probe.inside_s == pytest.approx(0.08, abs=0.02)


def test_words_an_offline_decode_invented_are_not_missing_from_a_stream():
    """The offline reference's own inventions (a loop, a sentence made up in a pause) are not counted as missing when
    the stream does not say them; real words it drops still are."""
    offline = "printing in the only sense are imaginable to this fabric".split()
    reference = "printing in the only sense".split()
    assert bench.missing_words(offline, "printing in the only sense".split()) == 5  # against the offline text
    assert bench.missing_words(offline, "printing in the only sense".split(), reference) == 0
    assert bench.missing_words(offline, "printing in the".split(), reference) == 2  # "only sense" dropped


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_cost_vs_offline_times_each_utterance_as_a_file(short_target):
    """The live cost is the engine's seconds per second of the sessions' audio (pauses included); the offline cost
    is spec's seconds per second of the utterances alone, each transcribed as a file — all of them, in order."""
    from asr_spec.evaluation.data import Session
    from asr_spec.transcribe import Transcriber

    class Counting(Transcriber):
        def transcribe(self, audio, options=None):
            heard.append(len(audio))
            return super().transcribe(audio, options)

    heard: list[int] = []
    pieces = [np.full(8000, 0.01, np.float32), np.full(12000, 0.02, np.float32), np.full(4000, 0.03, np.float32)]
    sessions = [Session(np.zeros(32000, np.float32), [(0.0, pieces[0]), (1.0, pieces[1])], ["", ""]),
                Session(np.zeros(16000, np.float32), [(0.0, pieces[2])], [""])]
    out = bench.cost_vs_offline(Counting(short_target), sessions, busy=0.6)
    assert heard == [8000, 12000, 4000]
    assert out["engine_s_per_stream_s"] == pytest.approx(0.6 / 3.0, abs=1e-4)
    assert out["offline_s_per_audio_s"] > 0
    ratio = out["engine_s_per_stream_s"] / out["offline_s_per_audio_s"]
    assert out["cost_vs_offline"] == pytest.approx(ratio, rel=0.01, abs=0.005)  # rounded to two decimals
