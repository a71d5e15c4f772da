"""OpenAI's Realtime API (transcription) on `asr_spec serve`, driven by the `openai` SDK's own realtime clients (GA
and beta) against a real server on loopback with the embedded whisper-base: live deltas that add up to each turn's
transcript, the native protocol's text for the same 24 kHz audio, manual commits, errors the session survives, keys.

Every wait has a deadline and every failure says which events it saw."""
from __future__ import annotations

import asyncio
import base64
import json
import time

import jiwer
import numpy as np
import pytest
import soxr
from asr_spec.server.config import ServerConfig
from conftest import DEV
from server_proc import in_process
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from whisper_normalizer.english import EnglishTextNormalizer

from asr_spec.audio import load_audio
from asr_spec.streaming.engine import Engine
from asr_spec.transcribe import TranscribeOptions

pytestmark = pytest.mark.slow  # a real server, browser, subprocess or real weights

KEY = "rt-Key_7"
JFK = DEV / "jfk-inaugural-1961-ask-not.wav"
CLIPS = [JFK, DEV / "LJ001-0004.wav", DEV / "LJ001-0011.wav"]
NATIVE_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 600}  # as start's
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
normalize = EnglishTextNormalizer()


@pytest.fixture(scope="module")
def server(base_transcriber):
    # a whole utterance in one append event (at most 8 s by default), and in one native frame as well
    config = ServerConfig(port=0, api_keys=(KEY,), max_sessions=6, max_sessions_per_client=6,
                          max_frame_bytes=4 * 1024 * 1024, max_append_s=60.0)
    with in_process(Engine(base_transcriber), config) as s:
        yield s


def pcm24(audio: np.ndarray, silence_s: float = 0.0) -> bytes:
    """16 kHz float audio as 24 kHz pcm16 (the Realtime API's format), with ``silence_s`` of silence after it."""
    x = np.concatenate([soxr.resample(audio, 16000, 24000), np.zeros(int(silence_s * 24000), np.float32)])
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def client(port: int, key: str = KEY):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", websocket_base_url=f"ws://127.0.0.1:{port}/v1",
                       api_key=key, max_retries=0)


async def recv(conn, seen: list, timeout: float = 60.0) -> dict:
    """The next event as a dict; the SDK's parsed type name is kept under ``_sdk_type``."""
    try:
        event = await asyncio.wait_for(conn.recv(), timeout)
    except asyncio.TimeoutError:
        pytest.fail(f"no event within {timeout} s; events so far: {[e['type'] for e in seen]}")
    d = event.to_dict() if hasattr(event, "to_dict") else dict(event)
    d["_sdk_type"] = type(event).__name__
    seen.append(d)
    return d


async def until(conn, seen: list, kind: str, timeout: float = 120.0, **match) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        e = await recv(conn, seen, max(0.1, deadline - time.monotonic()))
        if e["type"] == "error" and kind != "error":
            pytest.fail(f"error while waiting for {kind}: {e}; events: {[x['type'] for x in seen]}")
        if e["type"] == kind and all(e.get(k) == v for k, v in match.items()):
            return e


def ga_session(**audio_input) -> dict:
    return {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                                         "transcription": {"model": "whisper-1", "language": "en"},
                                                         **audio_input}}}


def turns(seen: list[dict]) -> dict[str, dict]:
    """Per item: its deltas joined, its completed transcript, and the order of its events."""
    out: dict[str, dict] = {}
    for e in seen:
        if (item := e.get("item_id") or (e.get("item") or {}).get("id")) is not None:
            t = out.setdefault(item, {"deltas": "", "completed": None, "kinds": []})
            t["kinds"].append(e["type"])
            t["deltas"] += e.get("delta", "") if e["type"] == DELTA else ""
            t["completed"] = e["transcript"] if e["type"] == COMPLETED else t["completed"]
    return out


def check_turns(seen: list[dict], vad: bool) -> list[str]:
    """Each item: deltas add up to its completed transcript, events in OpenAI's order; the transcripts in order."""
    by_item = turns(seen)
    assert by_item, f"no items: {[e['type'] for e in seen]}"
    for item, t in by_item.items():
        assert t["completed"] is not None, (item, t["kinds"])
        assert t["deltas"] == t["completed"], (item, t)
        kinds = t["kinds"]
        assert kinds.index("input_audio_buffer.committed") < kinds.index(COMPLETED), (item, kinds)
        assert kinds.index("conversation.item.added") < kinds.index(COMPLETED) < kinds.index("conversation.item.done")
        assert ("input_audio_buffer.speech_started" in kinds) == (vad and kinds[0] != "input_audio_buffer.committed")
    for e in seen:
        if e["type"] in (DELTA, COMPLETED, "input_audio_buffer.committed", "conversation.item.added"):
            assert e["_sdk_type"] != "dict", e  # the SDK parsed it as its own event type
        if e["type"] == COMPLETED:
            assert e["usage"]["type"] == "duration" and e["usage"]["seconds"] >= 0, e
    committed = [e for e in seen if e["type"] == "input_audio_buffer.committed"]
    assert [e.get("previous_item_id") for e in committed] == [None] + [e["item_id"] for e in committed[:-1]]
    return [by_item[e["item_id"]]["completed"] for e in committed]


def test_deltas_arrive_while_audio_is_sent_and_add_up_to_each_turn(server, base_transcriber):
    audio = load_audio(JFK)
    data = pcm24(audio)
    chunk = 4800  # 100 ms of 24 kHz pcm16

    async def main():
        seen: list[dict] = []
        async with client(server.port).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            created = await recv(conn, seen, 10)
            assert created["type"] == "session.created" and created["session"]["type"] == "transcription", created
            await conn.session.update(session=ga_session())
            updated = await until(conn, seen, "session.updated", 10)
            assert updated["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 500  # OpenAI's
            t0, sent = time.monotonic(), {}

            async def send():
                for i, start in enumerate(range(0, len(data), chunk)):
                    await asyncio.sleep(max(0.0, t0 + i * 0.1 - time.monotonic()))
                    await conn.input_audio_buffer.append(audio=b64(data[start:start + chunk]), event_id=f"a{i}")
                sent["speech"] = time.monotonic() - t0
                await conn.input_audio_buffer.append(audio=b64(pcm24(np.zeros(16000, np.float32))))
                await conn.input_audio_buffer.commit(event_id="last")

            sender = asyncio.create_task(send())
            arrivals = []
            while True:
                e = await recv(conn, seen, 120)
                assert e["type"] != "error", e
                arrivals.append((time.monotonic() - t0, e["type"]))
                if e["type"] == "conversation.item.done" and sender.done() and all(
                        "conversation.item.done" in t["kinds"] for t in turns(seen).values()):
                    break
            await sender
            return seen, arrivals, sent

    seen, arrivals, sent = asyncio.run(main())
    first_delta = next(t for t, kind in arrivals if kind == DELTA)
    print(f"speech sent over {sent['speech']:.1f} s; first delta at {first_delta:.1f} s")
    assert first_delta < sent["speech"] - 1.0, (first_delta, sent, arrivals)
    texts = check_turns(seen, vad=True)
    said = " ".join(t for t in texts if t)
    offline = base_transcriber.transcribe(load_audio(JFK), TranscribeOptions(language="en")).text
    print(f"offline:  {offline}\nrealtime: {said}")
    assert jiwer.wer(normalize(offline), normalize(said)) < 0.3


def native_utterances(port: int, data: bytes) -> list[str]:
    """The native protocol's finals for ``data`` (24 kHz pcm16, one frame), one text per utterance. ``close`` goes
    once VAD has ended the utterance, as the realtime side commits only after its turn ended: a flush that came
    first would decode the trailing silence too."""
    texts, current = [], None
    with connect(f"ws://127.0.0.1:{port}/", additional_headers={"Authorization": f"Bearer {KEY}"},
                 max_size=None) as ws:
        ws.send(json.dumps({"type": "start", "sample_rate": 24000, "encoding": "pcm_s16le", "language": "en"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "ready"
        ws.send(data)
        while (e := json.loads(ws.recv(timeout=120)))["type"] != "closed":
            assert e["type"] in ("partial", "final"), e
            if e["type"] == "final":
                current = e["text"] if current is None else current + e["join"] + e["text"]
                if e["end_of_utterance"]:
                    texts.append(current)
                    current = None
                    if len(texts) == 1:
                        ws.send(json.dumps({"type": "close"}))
    return [t for t in texts if t]


def test_completed_transcripts_equal_the_native_protocols_finals(server):
    """The same 24 kHz audio and options (VAD as the native start's), all of it in one message each way, so that
    both streams are decoded alike: every turn's transcript is the native utterance's final text, exactly."""
    async def realtime(data: bytes) -> list[str]:
        seen: list[dict] = []
        async with client(server.port).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await conn.session.update(session=ga_session(turn_detection=NATIVE_VAD))
            await until(conn, seen, "session.updated", 10)
            await conn.input_audio_buffer.append(audio=b64(data))
            await until(conn, seen, "conversation.item.done")  # server VAD ends the turn in the trailing silence
            await conn.input_audio_buffer.commit()  # anything left (an empty item, or input_audio_buffer_commit_empty)
            while (e := await recv(conn, seen, 60))["type"] not in ("conversation.item.done", "error"):
                pass
            assert e["type"] != "error" or e["error"]["code"] == "input_audio_buffer_commit_empty", e
            return [t for t in check_turns([x for x in seen if x["type"] != "error"], vad=True) if t]

    for clip in CLIPS:
        data = pcm24(load_audio(clip), silence_s=1.5)
        native = native_utterances(server.port, data)
        rt = asyncio.run(realtime(data))
        print(f"{clip.name}\n  native:   {native}\n  realtime: {rt}")
        assert rt == native and native, clip.name


def test_manual_commits_and_errors_the_session_survives(server):
    clips = [load_audio(DEV / "LJ001-0002.wav"), load_audio(DEV / "LJ001-0008.wav")]

    async def main():
        seen: list[dict] = []
        async with client(server.port).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await recv(conn, seen, 10)
            await conn.send_raw('{"type": "input_audio_buffer.append", "audio": "AAAA", "event_id": "early"}')
            e = await until(conn, seen, "error", 10)
            assert (e["error"]["code"], e["error"]["event_id"]) == ("session_not_configured", "early"), e
            await conn.session.update(session=ga_session(turn_detection=None))
            assert (await until(conn, seen, "session.updated", 10))["session"]["audio"]["input"]["turn_detection"] is None
            for bad, code in [("{not json", "invalid_json"), ('{"type": "response.create", "event_id": "r1"}',
                                                               "invalid_value"),
                              ('{"type": "input_audio_buffer.append", "audio": "@@@"}', "invalid_value"),
                              ('{"type": "input_audio_buffer.commit", "event_id": "c0"}',
                               "input_audio_buffer_commit_empty")]:
                await conn.send_raw(bad)
                e = await until(conn, seen, "error", 10)
                assert e["error"]["code"] == code and e["error"]["type"] == "invalid_request_error", (bad, e)
                assert e["_sdk_type"] == "RealtimeErrorEvent", e
            assert e["error"]["event_id"] == "c0"
            for i, audio in enumerate(clips):
                data = pcm24(audio)
                for start in range(0, len(data), 24000):
                    await conn.input_audio_buffer.append(audio=b64(data[start:start + 24000]))
                await conn.input_audio_buffer.commit(event_id=f"commit{i}")
                committed = await until(conn, seen, "input_audio_buffer.committed", 10)
                await until(conn, seen, COMPLETED, 120, item_id=committed["item_id"])
                await until(conn, seen, "conversation.item.done", 10)
            return seen

    seen = asyncio.run(main())
    texts = check_turns([e for e in seen if e["type"] != "error"], vad=False)
    assert not any(e["type"].startswith("input_audio_buffer.speech_") for e in seen)
    print(texts)
    assert [normalize(t) for t in texts] == ["in being comparatively modern", "has never been surpassed"]


def test_the_beta_client_gets_beta_events(server):
    async def main():
        seen: list[dict] = []
        async with client(server.port).beta.realtime.connect(model="whisper-1",
                                                             extra_query={"intent": "transcription"}) as conn:
            created = await recv(conn, seen, 10)
            assert created["type"] == "transcription_session.created", created
            await conn.transcription_session.update(session={
                "input_audio_format": "pcm16", "input_audio_transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 600}})
            updated = await until(conn, seen, "transcription_session.updated", 10)
            assert updated["session"]["input_audio_format"] == "pcm16", updated
            await conn.input_audio_buffer.append(audio=b64(pcm24(load_audio(DEV / "LJ001-0008.wav"), 1.5)))
            done = await until(conn, seen, COMPLETED)
            return seen, done

    seen, done = asyncio.run(main())
    kinds = [e["type"] for e in seen]
    assert "conversation.item.created" in kinds and "conversation.item.added" not in kinds, kinds
    assert normalize(done["transcript"]) == "has never been surpassed", done


def test_keys_from_the_header_or_the_browser_subprotocol_and_a_wrong_key_is_refused(server):
    async def refused(key: str):
        with pytest.raises(Exception) as info:
            async with client(server.port, key).realtime.connect(extra_query={"intent": "transcription"}) as conn:
                await recv(conn, [], 5)
        return info.value

    error = asyncio.run(refused("wrong-key"))
    assert "401" in str(error) or getattr(getattr(error, "response", None), "status_code", None) == 401, repr(error)
    url = f"ws://127.0.0.1:{server.port}/v1/realtime?intent=transcription"
    with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}", "openai-beta.realtime-v1"],
                 open_timeout=10) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(ws.recv(timeout=10))["type"] == "transcription_session.created"
    for protocols in (["realtime", "openai-insecure-api-key.nope"], ["realtime"]):
        with pytest.raises(InvalidStatus) as info:
            connect(url, subprotocols=protocols, open_timeout=10)
        assert info.value.response.status_code == 401


def test_keywords_fix_a_misheard_name_and_logprobs_come_with_the_transcript(server):
    """``transcription.keywords`` as hotwords: whisper-base mishears the city in this LJ Speech sentence; with it among
    the session's keywords the completed transcript writes "Lübeck". A session.update that sets them is reported
    back with them. With ``include: [logprobs]`` the completed event carries each text token of the transcript with
    the target's log-probability (OpenAI's shape: token, logprob, bytes)."""
    completed: list[dict] = []

    async def transcript(**transcription) -> tuple[str, dict]:
        seen: list[dict] = []
        session = ga_session()
        session["audio"]["input"]["transcription"].update(transcription)
        session["include"] = ["item.input_audio_transcription.logprobs"]
        async with client(server.port).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await conn.session.update(session=session)
            updated = await until(conn, seen, "session.updated", 10)
            await conn.input_audio_buffer.append(audio=b64(pcm24(load_audio(DEV / "LJ001-0028.wav"), silence_s=1.5)))
            done = await until(conn, seen, COMPLETED)
            completed.append(done)
            return done["transcript"], updated["session"]

    plain, _ = asyncio.run(transcript())
    hot, session = asyncio.run(transcript(keywords=["Lübeck", "Strasbourg", "Basel"]))
    print(f"without: {plain!r}\nwith keywords: {hot!r}")
    assert session["audio"]["input"]["transcription"]["keywords"] == ["Lübeck", "Strasbourg", "Basel"]
    assert "Lübeck" not in plain and "Paris" in plain
    assert "Lübeck" in hot
    for done in completed:
        tokens = done["logprobs"]
        assert "".join(t["token"] for t in tokens).strip() == done["transcript"], tokens
        assert all(t["logprob"] <= 0 and bytes(t["bytes"]) == t["token"].encode() for t in tokens)
        assert min(t["logprob"] for t in tokens) > -20


def test_delay_is_applied_and_ignored_fields_get_warnings(server):
    """With the openai SDK: ``transcription.delay`` is reported back and the turn still completes; fields accepted
    without effect (turn_detection's eagerness and create_response, noise_reduction) each get a ``warning`` event
    naming the field, after ``session.updated``; the session goes on (no error)."""
    async def run() -> tuple[list[dict], dict]:
        seen: list[dict] = []
        session = ga_session(turn_detection={**NATIVE_VAD, "eagerness": "low", "create_response": False},
                             noise_reduction={"type": "near_field"})
        session["audio"]["input"]["transcription"]["delay"] = "high"
        async with client(server.port).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await conn.session.update(session=session)
            updated = await until(conn, seen, "session.updated", 10)
            await conn.input_audio_buffer.append(audio=b64(pcm24(load_audio(JFK), silence_s=1.5)))
            done = await until(conn, seen, COMPLETED)
        return seen, {"updated": updated, "done": done}

    seen, got = asyncio.run(run())
    assert got["updated"]["session"]["audio"]["input"]["transcription"]["delay"] == "high"
    assert "ask not what your country" in normalize(got["done"]["transcript"])
    warnings = [e for e in seen if e["type"] == "warning"]
    assert [w["warning"]["param"] for w in warnings] == [
        "session.audio.input.turn_detection.create_response", "session.audio.input.turn_detection.eagerness",
        "session.audio.input.noise_reduction"], warnings
    assert all(w["warning"]["code"] == "ignored_parameter" and "no effect" in w["warning"]["message"]
               for w in warnings)
    kinds = [e["type"] for e in seen]
    assert kinds.index("session.updated") < kinds.index("warning") and "error" not in kinds
