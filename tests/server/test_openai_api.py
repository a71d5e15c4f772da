"""The OpenAI-compatible audio API of `asr_spec serve`, driven by the official `openai` client against a real
server on loopback (the embedded whisper-base and its draft), and by raw HTTP for what the client never sends."""
from __future__ import annotations

import http.client
import json
import threading

import openai
import pytest
from asr_spec.server.config import ServerConfig
from asr_spec.server.files import FileWorker
from conftest import DEV
from server_proc import in_process

from asr_spec.audio import load_audio
from asr_spec.models.loader import default_draft, load_draft
from asr_spec.streaming.engine import Engine
from asr_spec.transcribe import TranscribeOptions, Transcriber

pytestmark = pytest.mark.slow  # a real server and real weights

KEY = "test-key"
FILES = ["jfk-inaugural-1961-ask-not.wav", "LJ001-0001.wav", "LJ001-0004.wav"]


@pytest.fixture(scope="module")
def transcriber(base_model):
    return Transcriber(base_model, load_draft(default_draft("whisper-base"), base_model))


def running(transcriber, **config):
    return in_process(Engine(transcriber), ServerConfig(port=0, **config), FileWorker(transcriber, batch_size=4))


@pytest.fixture(scope="module")
def server(transcriber):
    with running(transcriber, api_keys=(KEY,)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def offline(transcriber):
    """What `asr_spec transcribe` gives for each file (its default options)."""
    return {name: transcriber.transcribe(load_audio(DEV / name), TranscribeOptions()) for name in FILES}


def test_the_openai_client_gets_the_text_of_asr_spec_transcribe(client, offline):
    for name in FILES:
        with open(DEV / name, "rb") as f:
            result = client.audio.transcriptions.create(model="whisper-1", file=f)
        assert result.text == offline[name].text, name


def test_every_response_format_parses(client, offline):
    name = FILES[0]
    expected = offline[name]
    audio = (DEV / name).read_bytes()
    create = lambda fmt, **kw: client.audio.transcriptions.create(  # noqa: E731
        model="whisper-1", file=(name, audio), response_format=fmt, **kw)
    assert create("text").strip() == expected.text
    srt = create("srt")
    assert srt.startswith("1\n") and "-->" in srt and expected.segments[0].text.strip() in srt
    vtt = create("vtt")
    assert vtt.startswith("WEBVTT") and "-->" in vtt
    verbose = create("verbose_json", timestamp_granularities=["segment", "word"])
    assert verbose.text == expected.text and verbose.language == "english" and verbose.duration == pytest.approx(11.0, abs=0.1)
    assert [s.text for s in verbose.segments] == [s.text for s in expected.segments]
    words = verbose.words
    assert " ".join(w.word for w in words).split() == expected.text.split()
    starts = [w.start for w in words]
    assert starts == sorted(starts) and all(w.start <= w.end for w in words)
    assert 0 <= words[0].start and words[-1].end <= verbose.duration + 0.01


def test_translations_and_a_prompt(client, transcriber):
    name = FILES[1]
    with open(DEV / name, "rb") as f:
        result = client.audio.translations.create(model="whisper-1", file=f)
    assert result.text == transcriber.transcribe(load_audio(DEV / name), TranscribeOptions(task="translate")).text
    prompt = "Printing, in the only sense with which we are at present concerned"
    with open(DEV / name, "rb") as f:
        prompted = client.audio.transcriptions.create(model="whisper-1", file=f, prompt=prompt, language="en")
    assert prompted.text == transcriber.transcribe(load_audio(DEV / name),
                                                   TranscribeOptions(language="en", initial_prompt=prompt)).text


def test_requests_sent_together_are_answered_alike(client, offline):
    """Several uploads at once are decoded by the file worker side by side: each gets its own file's text."""
    results: dict[int, str] = {}

    def send(i: int) -> None:
        with open(DEV / FILES[i % 2], "rb") as f:
            results[i] = client.audio.transcriptions.create(model="whisper-1", file=f).text

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert {i: results.get(i) for i in range(4)} == {i: offline[FILES[i % 2]].text for i in range(4)}


def test_bad_requests_get_openai_errors(client, server):
    audio = (DEV / FILES[0]).read_bytes()
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0).audio.transcriptions.create(
            model="whisper-1", file=("a.wav", audio))
    assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model="whisper-1", file=("noise.wav", b"RIFF not really audio"))
    assert e.value.status_code == 400 and e.value.body["param"] == "file" and "cannot decode" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio), response_format="xml")
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio), language="klingon")
    assert e.value.body["param"] == "language"
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio), temperature=3)
    assert e.value.body["param"] == "temperature"
    # free text is bounded where it enters: a prompt longer than Whisper could read, a megabyte one (never parsed
    # whole), a model name of 100k characters
    for field, value in (("prompt", "word " * 500), ("prompt", "word " * 200_000), ("model", "m" * 100_000)):
        with pytest.raises(openai.BadRequestError) as e:
            client.audio.transcriptions.create(**{"model": "whisper-1", "file": ("a.wav", audio), field: value})
        assert e.value.body["code"] == "string_above_max_length", (field, len(value), e.value.body)
        assert len(e.value.body["message"]) < 300, e.value.body
    # the server goes on: a good request after the bad ones
    assert client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio)).text


def test_a_client_that_disconnects_mid_upload_is_not_a_server_failure(server, caplog):
    """A client that announces 5 MB, sends 2 KB and closes: logged as the client's doing (no traceback, nothing at
    ERROR), counted as ``disconnected``, never as a 500; the server goes on."""
    import socket
    import time

    from prometheus_client.parser import text_string_to_metric_families

    def uploads() -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        text = conn.getresponse().read().decode()
        (family,) = [f for f in text_string_to_metric_families(text) if f.name == "asr_spec_uploads"]
        return {(x.labels["outcome"], x.labels["status"]): x.value for x in family.samples if x.name.endswith("_total")}

    before = uploads()
    with caplog.at_level("INFO", logger="asr_spec"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                         + b"\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: 5000000\r\n\r\n"
                         + b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
                         + b"x" * 2048)
        deadline = time.monotonic() + 30
        while (after := uploads()).get(("disconnected", "499"), 0) <= before.get(("disconnected", "499"), 0):
            assert time.monotonic() < deadline, f"the disconnect was never counted: {after}"
            time.sleep(0.2)
    assert after.get(("failed", "500"), 0) == before.get(("failed", "500"), 0), after
    errors = [r for r in caplog.records if r.levelno >= 40 or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]
    assert any("disconnected" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    with open(DEV / FILES[0], "rb") as f:
        assert openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY, max_retries=0,
                             timeout=120).audio.transcriptions.create(model="whisper-1", file=f).text


def _post(port: int, body, headers: dict, chunked: bool = False) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/audio/transcriptions", body=body, headers={"Authorization": f"Bearer {KEY}", **headers},
                     encode_chunked=chunked)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_too_large_not_multipart_and_chunked_uploads_are_refused(server):
    status, body = _post(server.port, b"x" * (26 * 1024 * 1024), {"Content-Type": "multipart/form-data; boundary=b"})
    assert status == 413 and body["error"]["param"] == "file"
    status, body = _post(server.port, b'{"file": "a.wav"}', {"Content-Type": "application/json"})
    assert status == 400 and body["error"]["code"] == "invalid_content_type"
    status, body = _post(server.port, iter([b"--b\r\n", b"--b--\r\n"]),
                         {"Content-Type": "multipart/form-data; boundary=b", "Transfer-Encoding": "chunked"}, chunked=True)
    assert status == 411


def test_uploads_are_counted_in_the_metrics(server):
    """After the uploads above: /metrics (Prometheus' parser) counts the transcribed ones and the refused ones by
    HTTP status."""
    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    text = conn.getresponse().read().decode()
    (uploads,) = [f for f in text_string_to_metric_families(text) if f.name == "asr_spec_uploads"]
    counts = {(s.labels["outcome"], s.labels["status"]): s.value for s in uploads.samples if s.name.endswith("_total")}
    assert counts[("transcribed", "200")] >= 5 and counts[("refused", "400")] >= 3 and counts[("refused", "413")] >= 1


def test_a_server_full_of_uploads_says_busy(transcriber):
    """Beyond the waiting limit a request gets 503 at once, with Retry-After, and the server recovers when the queue
    drains."""
    with running(transcriber) as s:
        s.files.max_waiting = 1
        audio = (DEV / FILES[0]).read_bytes()
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="none", timeout=120, max_retries=0)
        outcomes: list[object] = []

        def send() -> None:
            try:
                outcomes.append(c.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio)).text)
            except openai.APIStatusError as e:
                outcomes.append(e.status_code)
                retry_after.append(int(e.response.headers["retry-after"]))

        retry_after: list[int] = []
        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert 503 in outcomes and any(isinstance(o, str) and o for o in outcomes), outcomes
        assert retry_after and all(r > 0 for r in retry_after)  # a full queue tells the client when to come back
        assert c.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio)).text
