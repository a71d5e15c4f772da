"""The streaming engine's scheduling on the tiny model (fast): which streams one step decodes together."""
from __future__ import annotations

import numpy as np

from asr_spec.recognizer import Recognizer
from asr_spec.streaming.config import EngineConfig
from asr_spec.streaming.engine import Engine
from asr_spec.streaming.config import StreamConfig


def _noise(seconds: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)


def test_streams_nearly_due_join_a_batch_that_decodes_anyway(tiny_target):
    """A stream due after its 0.5 s step takes along, in the same batch, another with at least half a step of new
    audio (after which both are in step); one with less waits. ``join_share`` 1 turns joining off."""
    for share, together in ((0.5, 2), (1.0, 1)):
        engine = Engine(Recognizer(tiny_target), EngineConfig(max_step_s=0.0, join_share=share))
        config = StreamConfig(vad=False, step_s=0.5, policy="local-agreement")
        due, near, fresh = (engine.open(config) for _ in range(3))
        for sid, seconds in ((due, 0.5), (near, 0.3), (fresh, 0.1)):
            engine.feed(sid, _noise(seconds, sid))
        assert engine.poll()
        engine.step()
        assert engine.decodes == together, share
        assert [engine.stream_stats(sid)["decodes"] for sid in (due, near, fresh)] == [1, together - 1, 0]
