"""Uploads to the OpenAI-compatible API wait for due live streams (tiny model, the server's FileWorker): an
upload does not go on with its windows while ``live()`` says streams are due, and never waits longer than
``max_yield_s`` in a row, so a server kept busy by live sessions still finishes uploads."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from asr_spec.server.files import FileWorker, Upload

from asr_spec.recognizer import Checks
from asr_spec.transcribe import TranscribeOptions, Transcriber

# a random model's text always fails Whisper's checks: without them an upload is one decode of at most 32 tokens
# (~0.3 s) instead of six (the temperature ladder), so the 1.5 s an upload must wait below really holds it back
QUICK = TranscribeOptions(checks=Checks(compression_ratio_threshold=None, logprob_threshold=None))


def _upload(seconds: float = 2.0) -> Upload:
    audio = np.random.default_rng(0).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)
    return Upload("transcribe", audio, "noise.wav", "whisper-1", "en", None, 0.0, "json", False)


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_an_upload_waits_while_live_streams_are_due(short_target):
    due = threading.Event()
    due.set()
    worker = FileWorker(Transcriber(short_target, None), QUICK, live=due.is_set, max_yield_s=60.0)
    try:
        future = worker.submit(_upload())
        time.sleep(1.5)  # the tiny model transcribes this in well under a second when nothing holds it back
        assert not future.done()
        due.clear()
        assert future.result(timeout=60).text is not None
        assert worker.yielded_s >= 1.0  # the worker may take the request up to 0.2 s after it was submitted
    finally:
        worker.stop()


def test_uploads_still_finish_when_live_streams_never_stop(short_target):
    worker = FileWorker(Transcriber(short_target, None), QUICK, live=lambda: True, max_yield_s=0.2)
    try:
        futures = [worker.submit(_upload()) for _ in range(2)]
        assert all(f.result(timeout=60).text is not None for f in futures)
        assert worker.yielded_s >= 0.2
    finally:
        worker.stop()
