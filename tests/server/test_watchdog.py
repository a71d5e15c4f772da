"""Watchdogs: `asr_spec serve` attacked the way busy services and careless clients attack it. A real server
on loopback with the embedded models; real WebSocket clients. Every session's words must arrive (WER against
the references, or the offline transcript of the same audio), the other sessions keep being served,
``/healthz`` answers, and the engine is idle soon after the clients leave. Every wait has a deadline."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.request
from collections import Counter

import jiwer
import numpy as np
import pytest
from asr_spec.clients.stream import stream_file
from conftest import DEV, system_tool
from test_server import pcm16, running
from websockets.sync.client import connect
from whisper_normalizer.basic import BasicTextNormalizer
from whisper_normalizer.english import EnglishTextNormalizer

from asr_spec.audio import load_audio
from asr_spec.models.loader import default_draft, load_draft, load_target
from asr_spec.streaming.config import StreamConfig
from asr_spec.streaming.engine import Engine, stream_pieces
from asr_spec.transcribe import TranscribeOptions, Transcriber

pytestmark = pytest.mark.slow
normalize = EnglishTextNormalizer()
basic = BasicTextNormalizer()


@pytest.fixture(scope="module")
def transcriber(base_model):  # base_model: the embedded model converted first
    """The embedded models at int8: what ``serve`` runs by default (``auto``) on an AVX2 CPU, and a fifth less of
    CI's time than float32 on a 2-core AVX2 EPYC (this module: 257 against 318 s, two runs of one morning). The
    attacks test the server's robustness, not a type's numbers (each type's exactness: tests/decoding/test_compute.py,
    tests/decoding/test_exact_real_speech.py)."""
    model = load_target("whisper-base", compute_type="int8")
    return Transcriber(model, load_draft(default_draft("whisper-base"), model))


@pytest.fixture(scope="module")
def server(transcriber):
    with running(transcriber, max_sessions=12, max_sessions_per_client=12, idle_timeout_s=60) as s:
        yield s


def manifest() -> list[dict]:
    return [json.loads(x) for x in (DEV / "manifest.jsonl").read_text().splitlines()]


def joined(seconds: float, offset: int, gap_s: float = 0.0) -> np.ndarray:
    """Dev utterances back to back (``gap_s`` of silence between them) until ``seconds`` of audio."""
    return joined_with_text(seconds, offset, gap_s)[0]


def joined_with_text(seconds: float, offset: int, gap_s: float = 0.0) -> tuple[np.ndarray, str]:
    """:func:`joined` and the reference text of what it says."""
    items, parts, texts, total, i = manifest(), [], [], 0.0, offset
    while total < seconds:
        a = load_audio(DEV / items[i % len(items)]["audio"])
        parts += [a, np.zeros(int(gap_s * 16000), np.float32)]
        texts.append(items[i % len(items)]["text"])
        total += len(a) / 16000 + gap_s
        i += 1
    return np.concatenate(parts), " ".join(texts)


def finals_text(events: list[dict]) -> str:
    return "".join(e["join"] + e["text"] for e in events if e["type"] == "final")


ASK_NOT = "And so, my fellow Americans: ask not what your country can do for you, ask what you can do for your country."


def wer(reference: str, hypothesis: str) -> float:
    return 100 * jiwer.wer(normalize(reference), normalize(hypothesis))


def ngrams(text: str, n: int) -> Counter:
    w = re.findall(r"[a-z']+", normalize(text))
    return Counter(" ".join(w[i:i + n]) for i in range(len(w) - n + 1))


def loops(text: str, reference: str, n: int = 6, extra: int = 2) -> list[str]:
    """Word n-grams the stream repeats more than ``extra`` times beyond the offline transcript (a decoder stuck
    in a loop repeats whole phrases; the speech itself may repeat them too)."""
    ref = ngrams(reference, n)
    return [g for g, c in ngrams(text, n).items() if c > ref[g] + extra]


def closed_event(events: list[dict]) -> dict:
    closed = [e for e in events if e["type"] == "closed"]
    assert closed, f"no closed event; last events: {events[-3:]}"
    return closed[-1]


def wait_idle(server, seconds: float) -> float:
    """Seconds until the engine has no stream and nothing due; fails after ``seconds``."""
    t0 = time.monotonic()
    while server.engine.snapshot() or server.engine.poll():
        assert time.monotonic() - t0 < seconds, f"engine still busy: {server.engine.snapshot()}"
        time.sleep(0.05)
    return time.monotonic() - t0


def healthy(url: str) -> bool:
    port = url.rsplit(":", 1)[1]
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10).read() == b"ok\n"


def in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run ``fn`` in a daemon thread; the dict gets its value ("v") or its exception ("e")."""
    out: dict = {}

    def run() -> None:
        try:
            out["v"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by ``result``
            out["e"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def result(out: dict):
    if "e" in out:
        raise out["e"]
    return out["v"]


def run_with_deadline(fn, seconds: float):
    thread, out = in_thread(fn)
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} did not finish within {seconds} s"
    return result(out)


def test_fast_sender_long_form_loses_nothing(server, transcriber):
    """The 237 s talk ``WATCHDOG_REPEATS`` times (default once; 4 for a long run) in one session, as fast as the
    server lets the client send (backpressure): within 2 WER points of offline, no repeated-phrase loop, every
    received second decoded."""
    srv, url = server
    repeats = int(os.environ.get("WATCHDOG_REPEATS", "1"))
    meta = json.loads((DEV / "longform" / "manifest.jsonl").read_text().splitlines()[0])
    talk = load_audio(DEV / "longform" / meta["audio"])
    offline = transcriber.transcribe(talk, TranscribeOptions(language="en")).text
    t0 = time.monotonic()
    events = run_with_deadline(lambda: stream_file(url, np.concatenate([talk] * repeats), None), 300 * repeats)
    took = time.monotonic() - t0
    closed = closed_event(events)
    text = finals_text(events)
    streamed, offline_wer = wer(" ".join([meta["text"]] * repeats), text), wer(meta["text"], offline)
    print(f"fast long-form x{repeats}: {took:.0f} s; WER vs reference {streamed:.2f} % (offline {offline_wer:.2f} %), "
          f"vs offline {wer(' '.join([offline] * repeats), text):.2f} %; closed {closed}")
    assert closed["audio_seconds"] == pytest.approx(repeats * len(talk) / 16000, abs=0.01)
    assert closed["decoded_seconds"] == pytest.approx(closed["audio_seconds"], abs=0.01)
    assert streamed <= offline_wer + 2.0
    assert not loops(text, " ".join([offline] * repeats)), loops(text, " ".join([offline] * repeats))
    wait_idle(srv, 5)


def test_eight_concurrent_fast_senders_each_get_their_words(server, transcriber):
    """Eight sessions send 25 s each as fast as allowed: every session ends with all its audio decoded, no phrase
    looping, the server healthy, and each gets its words: no session loses half of them against the offline
    transcript. That bound holds at any machine's speed. How close the words come is not a property of the code
    alone: where a session's pieces fall depends on the engine's speed, and Whisper hears an utterance's opening
    differently in another piece (one session measured +0 to +7.5 points across runs, every decode exact; a dropped
    sentence costs 15-40), so the streaming WER against offline is measured by eval/bench_streaming.py, not here."""
    srv, url = server
    clips = [joined_with_text(25, 9 * i, gap_s=0.4) for i in range(8)]
    runs = [in_thread(lambda audio=audio: stream_file(url, audio, None)) for audio, _ in clips]
    deadline = time.monotonic() + 600
    for thread, _ in runs:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert all(not thread.is_alive() for thread, _ in runs), "a session did not finish within 600 s"
    assert healthy(url)
    added = []
    for i, ((audio, reference), (_, out)) in enumerate(zip(clips, runs)):
        events = result(out)
        offline = transcriber.transcribe(audio, TranscribeOptions(language="en")).text
        closed, streamed = closed_event(events), finals_text(events)
        print(f"session {i}: WER vs reference {wer(reference, streamed):.2f} % (offline {wer(reference, offline):.2f} "
              f"%), vs offline {wer(offline, streamed):.2f} %; {closed}")
        assert closed["decoded_seconds"] == pytest.approx(closed["audio_seconds"], abs=0.01)
        added.append(wer(reference, streamed) - wer(reference, offline))
        assert added[-1] <= 50.0, (reference, offline, streamed)
        assert not loops(streamed, reference), loops(streamed, reference)
    print(f"WER added to offline's, by session: {added}")
    wait_idle(srv, 5)


def test_a_fast_senders_last_sentence_is_said_once(transcriber):
    """The eight senders' fourth session in process, as its pieces once fell: its first second decoded alone, then
    the other 28.4 s at once and ``close``. At int8 on a 2-core AVX2 EPYC the final of its last 3.7 s said "... in
    Germany and France. Not only in Italy, but in Germany and France." (17.65 % WER against offline's 4.41 %) until
    a final kept only the words its audio holds (alignment.held); with the first piece 1.0-5.9 s long, 20 of 50
    such streams said (part of) a sentence twice, and 3 lost "and France." (docs/how-it-works.md)."""
    audio, reference = joined_with_text(25, 27, gap_s=0.4)
    audio = np.frombuffer(pcm16(audio), "<i2").astype(np.float32) / 32768  # as the server takes a client's frames
    events = run_with_deadline(lambda: stream_pieces(Engine(transcriber), [[audio[:16000], audio[16000:]]])[0], 300)
    streamed = finals_text([e.as_dict() for e in events])
    offline = transcriber.transcribe(audio, TranscribeOptions(language="en")).text
    print(f"streamed: {streamed}\noffline:  {offline}")
    assert not [g for g, c in ngrams(reference, 6).items() if c > 1]
    assert not (twice := [g for g, c in ngrams(streamed, 6).items() if c > 1]), twice
    assert wer(reference, streamed) <= wer(reference, offline) + 3.0, (reference, offline, streamed)


def test_finalize_spam_neither_hallucinates_nor_starves_a_normal_session(server):
    """An attacker sends finalize after every 100 ms frame; a normal client beside it still gets its first
    final in time (at most 6 s later than the same client alone on the same server, measured first: the bound
    follows this machine's speed), the attacker's 100 ms pieces are never decoded alone, and the engine is idle
    soon after."""
    srv, url = server
    attack_audio = joined(8, 3)
    attacker_events: list[dict] = []
    jfk = load_audio(DEV / "jfk-inaugural-1961-ask-not.wav")

    def first_final_of(arrivals: list, first_final: list):
        t0 = time.monotonic()
        return run_with_deadline(lambda: stream_file(url, jfk, 1.0, lambda e: arrivals.append((time.monotonic() - t0, e))
                                                     or (e["type"] == "final" and e["text"]
                                                         and first_final.append(time.monotonic() - t0))), 120)

    alone: list[float] = []
    first_final_of([], alone)
    wait_idle(srv, 10)

    def attack() -> None:
        with connect(url, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "pcm_s16le"}))
            for i in range(0, len(attack_audio), 1600):
                ws.send(pcm16(attack_audio[i:i + 1600]))
                ws.send(json.dumps({"type": "finalize"}))
                time.sleep(0.02)
            ws.send(json.dumps({"type": "close"}))
            for message in ws:
                attacker_events.append(json.loads(message))

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    time.sleep(1.0)
    first_final: list[float] = []
    arrivals: list[tuple[float, dict]] = []
    normal = first_final_of(arrivals, first_final)
    attacker.join(300)
    assert not attacker.is_alive(), "the attacker's session did not end"
    left = time.monotonic()
    # every word arrives; at most two differ (split at the pause under load, "ask not" may be heard as "is not")
    assert "what your country can do for you ask what you can do for your country" in normalize(finals_text(normal))
    assert wer(ASK_NOT, finals_text(normal)) <= 10.0, finals_text(normal)
    print(f"normal session's first final {first_final[0]:.2f} s after it started ({alone[0]:.2f} s alone); "
          f"attacker {closed_event(attacker_events)}")
    print("normal session:", [(round(t, 2), e["type"], e.get("text", "")[:40], e.get("end")) for t, e in arrivals])
    assert first_final[0] - alone[0] <= 6.0
    attacked = closed_event(attacker_events)
    assert attacked["decoded_seconds"] == pytest.approx(attacked["audio_seconds"], abs=0.01)  # its audio too
    finals = [e for e in attacker_events if e["type"] == "final" and e["text"]]
    assert finals and all(len(e["text"]) < 400 for e in finals)  # no 1000-character hallucinated finals
    assert closed_event(attacker_events)["decodes"] <= 3 * len(attack_audio) / 16000  # not one decode per frame
    assert wait_idle(srv, 5) <= 5 and time.monotonic() - left < 10


def test_flood_and_disconnect_is_cancelled_at_once(server):
    srv, url = server
    flood = joined(30, 5)
    ws = connect(url, open_timeout=30)
    ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "pcm_s16le"}))
    for i in range(0, 300 * 1600, 1600):
        ws.send(pcm16(flood[i:i + 1600]))
    # abrupt: no close message, no closing handshake (shutdown first: a bare close() of a socket that the client's
    # reader thread is blocked on sends nothing until that read returns, i.e. until the server sends an event)
    ws.socket.shutdown(socket.SHUT_RDWR)
    ws.socket.close()
    left = time.monotonic()
    idle = wait_idle(srv, 5)
    print(f"engine idle {idle:.2f} s after the flooding client left")
    assert healthy(url)
    events = run_with_deadline(lambda: stream_file(url, load_audio(DEV / "jfk-inaugural-1961-ask-not.wav"), None), 120)
    # every word arrives; where the stream's pieces fall follows the engine's speed, and Whisper has heard "ask not"
    # as "asked not" in one of them (CI, 2026-11-29): at most two words differ
    text = finals_text(events)
    assert "what your country can do for you ask what you can do for your country" in normalize(text), text
    assert wer(ASK_NOT, text) <= 10.0 and time.monotonic() - left < 120, text


def test_three_minutes_without_pauses(server, transcriber):
    """Continuous speech (dev utterances with the pauses cut out) never locks into a repeated sentence."""
    srv, url = server
    audio = joined(180, 20)
    offline = transcriber.transcribe(audio, TranscribeOptions(language="en")).text
    events = run_with_deadline(lambda: stream_file(url, audio, None), 600)
    text = finals_text(events)
    closed = closed_event(events)
    print(f"3 min without pauses: WER vs offline {wer(offline, text):.2f} %; {closed}")
    assert closed["decoded_seconds"] == pytest.approx(closed["audio_seconds"], abs=0.01)
    assert not loops(text, offline), loops(text, offline)
    assert wer(offline, text) <= 10.0
    wait_idle(srv, 5)


def test_token_dense_german_speech(server, transcriber, tmp_path):
    """German (espeak-ng) is token-dense: the decoder's room fills faster; the stream must still end, with
    every second decoded, the offline transcript's words and no loop."""
    srv, url = server
    wav = tmp_path / "de.wav"
    text = ("Die Bundesregierung hat am Mittwoch einen neuen Haushaltsentwurf vorgelegt. Der Finanzminister erklärte, "
            "dass die Ausgaben für Bildung und Forschung im kommenden Jahr deutlich steigen sollen. Gleichzeitig sollen "
            "die Schulden weiter sinken. Die Opposition kritisierte den Entwurf als unrealistisch und forderte mehr "
            "Investitionen in die Infrastruktur. Experten erwarten lange Verhandlungen im Bundestag. Am Wochenende soll "
            "das Wetter in ganz Deutschland freundlich werden, mit Temperaturen bis zu fünfundzwanzig Grad. Im Norden "
            "kann es vereinzelt regnen, im Süden bleibt es meist trocken.")
    espeak = system_tool("espeak-ng", install="sudo apt-get install espeak-ng (.ci/run installs it)")
    subprocess.run([espeak, "-v", "de", "-s", "150", "-w", str(wav), text], check=True, timeout=60)
    audio = load_audio(wav)
    offline = transcriber.transcribe(audio, TranscribeOptions(language="de")).text
    events = run_with_deadline(lambda: stream_file(url, audio, None, language="de"), 300)
    closed = closed_event(events)
    streamed = finals_text(events)
    print(f"German {len(audio) / 16000:.1f} s: WER vs offline {100 * jiwer.wer(basic(offline), basic(streamed)):.2f} %;"
          f" {closed}\noffline  {offline!r}\nstreamed {streamed!r}")
    assert closed["decoded_seconds"] == pytest.approx(closed["audio_seconds"], abs=0.01)
    assert not loops(streamed, offline)
    # nothing lost: a dropped window of this speech (several seconds) takes a tenth of its words or more
    words, heard = len(basic(offline).split()), len(basic(streamed).split())
    assert abs(heard - words) <= 0.1 * words, (heard, words)
    # The words themselves: sent as fast as allowed, the server's stream splits where the engine takes the audio in,
    # which follows the machine's speed (the same code gave 3.6-28.4 % here), so they are checked as such a stream
    # usually falls, its first second decoded alone and then the rest, fed to the engine in that order. Paced in
    # pieces of 0.5-4 s, this speech streams at 31-38 % against offline: open (docs/languages.md), not held here.
    pieces = [audio[:16000], audio[16000:]]
    fell = run_with_deadline(lambda: stream_pieces(Engine(transcriber), [pieces], StreamConfig(language="de"))[0], 300)
    fast = finals_text([e.as_dict() for e in fell])
    error = 100 * jiwer.wer(basic(offline), basic(fast))
    print(f"first second alone, then the rest: WER vs offline {error:.2f} %\n{fast!r}")
    assert not loops(fast, offline)
    assert error <= 25.0
    wait_idle(srv, 5)
