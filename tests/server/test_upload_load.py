"""Many uploads at once while a live session streams, on one real server on loopback (the tiny random model: what is
tested is that nothing stalls, not the text): the live session's events keep coming, every upload finishes with its
transcript (or a clear 503 when the queue is full), and the process's memory stays bounded."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import openai
import pytest
from asr_spec.clients.stream import stream_file
from asr_spec.server.config import ServerConfig
from asr_spec.server.files import FileWorker
from conftest import DEV
from server_proc import in_process

from asr_spec.audio import load_audio
from asr_spec.streaming.engine import Engine
from asr_spec.transcribe import Transcriber

pytestmark = pytest.mark.slow  # a real server and clients

UPLOADERS, EACH = 6, 3  # threads, uploads per thread: 18 in flight at most, beyond the queue's 16


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_live_decodes_keep_coming_while_many_uploads_run(short_target):
    """The live stream's audio never waits long for its decode (uploads yield to due streams), the session ends
    with all its audio, every upload is answered, memory stays bounded. (The tiny model's text seldom changes, so
    the stream's decodes are counted rather than its events.)"""
    transcriber = Transcriber(short_target)
    files = FileWorker(transcriber, batch_size=4, max_waiting=16)
    with in_process(Engine(transcriber), ServerConfig(port=0, max_sessions=4), files) as srv:
        before = rss_mb()
        statuses: list[int] = []
        texts: list[str] = []

        def upload() -> None:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="-", timeout=120, max_retries=0)
            for _ in range(EACH):
                try:
                    with open(DEV / "LJ001-0001.wav", "rb") as f:
                        texts.append(client.audio.transcriptions.create(model="whisper-1", file=f).text)
                    statuses.append(200)
                except openai.APIStatusError as e:
                    statuses.append(e.status_code)

        received: list[float] = []
        audio = load_audio(DEV / "jfk-inaugural-1961-ask-not.wav")
        uploaders = [threading.Thread(target=upload, daemon=True) for _ in range(UPLOADERS)]
        for t in uploaders:
            t.start()
        t0 = time.monotonic()
        events = stream_file(f"ws://127.0.0.1:{srv.port}", audio, 2.0, lambda e: received.append(time.monotonic()))
        streamed = time.monotonic() - t0
        for t in uploaders:
            t.join(120)
        assert not any(t.is_alive() for t in uploaders), "uploads still running 120 s after the stream ended"
        after = rss_mb()
        waits = list(srv.engine.queue_wait_s)
    print(f"stream {streamed:.1f} s, {len(received)} events, {len(waits)} decodes, queue waits max {max(waits):.2f} s, "
          f"uploads {statuses}, memory {before:.0f} -> {after:.0f} MB")

    assert events[-1]["type"] == "closed" and events[-1]["audio_seconds"] == pytest.approx(11.0, abs=0.3)
    assert len(waits) >= 5 and max(waits) < 3.0, f"{len(waits)} decodes, the audio waited up to {max(waits):.1f} s"
    assert len(statuses) == UPLOADERS * EACH and set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= 16 and len(texts) == statuses.count(200)
    assert after - before < 400, f"memory grew {after - before:.0f} MB"
