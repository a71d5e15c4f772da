"""One OpenMP pool per process (asr_spec/threads.py): a thread's workers end when it releases them, and a server's
inference thread holds the process's only pool whatever its sessions and uploads ran elsewhere."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time

import openai
import pytest
import soundfile as sf
import torch
from asr_spec.clients.stream import stream_file
from asr_spec.server.config import ServerConfig
from asr_spec.server.files import FileWorker
from conftest import DEV
from server_proc import in_process

from asr_spec.audio import load_audio
from asr_spec.streaming.engine import Engine
from asr_spec.threads import release_pool


def native_threads() -> set[int]:
    """The process's threads that Python did not start: OpenMP's workers among them."""
    started = {t.native_id for t in threading.enumerate()}
    return {int(t) for t in os.listdir("/proc/self/task")} - started


def parallel_work() -> None:
    torch.ones(1 << 22).add_(1)  # large enough for torch to run it on every thread


def settle(base: set[int], expected: int, what: str, within_s: float = 10.0) -> None:
    """Wait until the process has ``expected`` native threads beside ``base`` (threads take a moment to end)."""
    deadline = time.monotonic() + within_s
    while len(extra := native_threads() - base) != expected:
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: {len(extra)} native threads beside those before, not {expected}")
        time.sleep(0.05)


def test_a_thread_that_releases_its_pool_keeps_no_workers():
    torch.set_num_threads(2)  # conftest restores the count
    seen: dict[str, object] = {}

    def work() -> None:
        seen["found"] = release_pool()  # torch's Linux wheels run libgomp, which has OpenMP 5.0's pause
        base = native_threads()
        parallel_work()
        pool = native_threads() - base
        seen["pool"] = len(pool)
        release_pool()
        deadline = time.monotonic() + 5  # threads take a moment to end
        while (left := pool & native_threads()) and time.monotonic() < deadline:
            time.sleep(0.02)
        seen["after"] = len(left)  # its workers gone (other libraries may start threads)
        parallel_work()  # a released thread gets workers again when it needs them
        seen["again"] = len(native_threads() - base - pool)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert seen == {"found": True, "pool": 1, "after": 0, "again": 1}


@pytest.mark.slow  # a subprocess
def test_torch_s_pool_is_the_one_released_beside_other_wheels_libgomp():
    """pywhispercpp and CTranslate2 bundle a libgomp of their own, loaded beside torch's (and listed before it):
    releasing must pause torch's, or its workers run on (a suite that had run a peer first saw every release fail)."""
    code = (
        "import os, threading, time, torch\n"
        "import pywhispercpp.model  # its own libgomp, loaded first\n"
        "from asr_spec.threads import release_pool\n"
        "torch.set_num_threads(2)\n"
        "native = lambda: {int(t) for t in os.listdir('/proc/self/task')} - {t.native_id for t in threading.enumerate()}\n"
        "seen = {}\n"
        "def work():\n"
        "    release_pool(); base = native(); torch.ones(1 << 22).add_(1); pool = native() - base\n"
        "    release_pool(); deadline = time.monotonic() + 5\n"
        "    while pool & native() and time.monotonic() < deadline: time.sleep(0.02)\n"
        "    seen.update(pool=len(pool), after=len(pool & native()))\n"
        "t = threading.Thread(target=work); t.start(); t.join(60); print(seen)\n")
    maps = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert maps.returncode == 0, maps.stderr[-2000:]
    assert maps.stdout.strip().splitlines()[-1] == "{'pool': 1, 'after': 0}", maps.stdout + maps.stderr[-2000:]


@pytest.mark.slow
def test_the_inference_thread_holds_the_only_pool_after_sessions_and_uploads(base_transcriber):
    torch.set_num_threads(2)
    release_pool()
    base = native_threads()
    parallel_work()  # as the thread that loaded the models has
    settle(base, 1, "the main thread's pool")
    audio = load_audio(DEV / "jfk-inaugural-1961-ask-not.wav")
    with in_process(Engine(base_transcriber), ServerConfig(port=0), FileWorker(base_transcriber)) as server:
        settle(base, 0, "once the server is built")  # the main thread's workers ended
        url = f"ws://127.0.0.1:{server.port}"
        assert any(e["type"] == "final" for e in stream_file(url, audio, 8.0))
        wav = io.BytesIO()
        sf.write(wav, audio, 16000, format="WAV")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="-", timeout=120, max_retries=0)
        assert "ask not" in client.audio.transcriptions.create(model="whisper-base", file=("a.wav", wav.getvalue())).text
        assert any(e["type"] == "final" for e in stream_file(url, audio, 8.0))
        # the inference thread's one worker; none of the session threads', the upload worker's or the main thread's
        settle(base, 1, "after two sessions and an upload")
