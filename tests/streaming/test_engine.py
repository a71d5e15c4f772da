"""The streaming engine's scheduling on the tiny model (fast): which streams one step decodes together."""
from __future__ import annotations

import numpy as np
import pytest

from asr_spec.recognizer import Recognizer
from asr_spec.streaming.config import EngineConfig, StreamConfig
from asr_spec.streaming.engine import Engine
from asr_spec.streaming.policy import LocalAgreement


def _noise(seconds: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)


def test_streams_nearly_due_join_a_batch_that_decodes_anyway(tiny_target):
    """A stream due after its 0.5 s step takes along, in the same batch, another with at least half a step of new
    audio (after which both are in step); one with less waits. ``join_share`` 1 turns joining off."""
    for share, together in ((0.5, 2), (1.0, 1)):
        engine = Engine(Recognizer(tiny_target), EngineConfig(max_step_s=0.0, join_share=share))
        config = StreamConfig(vad=False, step_s=0.5, policy=LocalAgreement())
        due, near, fresh = (engine.open(config) for _ in range(3))
        for sid, seconds in ((due, 0.5), (near, 0.3), (fresh, 0.1)):
            engine.feed(sid, _noise(seconds, sid))
        assert engine.poll()
        engine.step()
        assert engine.decodes == together, share
        assert [engine.stream_stats(sid)["decodes"] for sid in (due, near, fresh)] == [1, together - 1, 0]


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_a_stream_end_to_end_is_exact_and_loses_nothing(tiny_target):
    """A stream driven through the engine on the tiny model without a draft, with one that drafts
    (``EngineConfig.draft``, the default) and with one the engine leaves to uploads (its hints only): every event
    the same (a stream's speculative decodes are exact, its hints and kept encoder states included); every second
    received leaves the buffer once; finals follow each other and the last ends the utterance."""
    from asr_spec.models.loader import load_draft
    from asr_spec.streaming.engine import stream_audio

    audio = _noise(3.0, 7)
    runs, drafted = {}, {}
    draft = load_draft("layers:0", tiny_target)
    for name, model, config in (("target", None, EngineConfig(max_step_s=0.0)),
                                 ("speculative", draft, EngineConfig(max_step_s=0.0, draft=True)),
                                 ("hints only", draft, EngineConfig(max_step_s=0.0, draft=False))):
        stats: list = []
        engine = Engine(Recognizer(tiny_target, model), config)
        events = stream_audio(engine, audio, StreamConfig(vad=False), chunk_s=0.3, stats=stats)
        runs[name] = [(e.type, e.text, round(e.start, 3), round(e.end, 3), e.end_of_utterance) for e in events]
        st = stats[0]
        drafted[name] = st.decode.drafted
        assert st.decodes >= 5 and st.decoded_s + st.skipped_s == pytest.approx(3.0)
        finals = [e for e in events if e.type == "final"]
        assert finals and finals[-1].end_of_utterance
        assert all(a.end <= b.start + 1e-6 for a, b in zip(finals, finals[1:]))
    assert runs["speculative"] == runs["target"] == runs["hints only"]
    assert drafted["speculative"] > 0 and drafted["target"] == drafted["hints only"] == 0
