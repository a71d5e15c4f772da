"""The Realtime API's session settings and audio formats (server/realtime_events.py), without a server: what a
``session.update`` may say, what it changes, the errors in OpenAI's shape, and G.711 decoding."""
from __future__ import annotations

import base64
import json
import warnings

import numpy as np
import pytest
from asr_spec.server.protocol import ProtocolError
from asr_spec.server.realtime_events import (
    G711,
    RealtimeAudio,
    RealtimeError,
    Settings,
    Vad,
    appended_audio,
    base64_audio,
    error_event,
    parse_event,
    parse_update,
)

from asr_spec.streaming.config import StreamConfig
from asr_spec.streaming.policy import AlignAtt, LocalAgreement

LANGUAGES = {"en", "de", "fr"}


def update(session: dict, current: Settings = Settings(), beta: bool = False) -> Settings:
    kind = "transcription_session.update" if beta else "session.update"
    return parse_update({"type": kind, "session": session}, current, LANGUAGES)


def refused(session: dict, param: str, code: str = "invalid_value", beta: bool = False) -> RealtimeError:
    with pytest.raises(RealtimeError) as info:
        update(session, beta=beta)
    assert (info.value.code, info.value.param) == (code, param), (session, info.value.code, info.value.param,
                                                                  info.value.message)
    assert len(info.value.message) < 600
    return info.value


def test_defaults_are_openais_and_a_ga_update_changes_only_what_it_names():
    s = Settings()
    assert (s.format, s.rate, s.language, s.vad) == ("audio/pcm", 24000, None, Vad(0.5, 300, 500))
    s = update({"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 24000},
        "transcription": {"model": "gpt-4o-transcribe", "language": "de", "prompt": "Namen"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 800, "create_response": False},
        "noise_reduction": {"type": "far_field"}}}, "include": ["item.input_audio_transcription.logprobs"]})
    assert (s.model, s.language, s.prompt, s.noise_reduction, s.logprobs) == ("gpt-4o-transcribe", "de", "Namen",
                                                                             "far_field", True)
    assert s.vad == Vad(0.5, 300, 800)
    s2 = update({"type": "transcription", "audio": {"input": {"turn_detection": None}}}, s)
    assert s2.vad is None and s2.language == "de" and s2.model == "gpt-4o-transcribe"
    config = s.stream(StreamConfig(step_s=1.0, policy=AlignAtt()))
    assert (config.vad, config.end_silence_s, config.preroll_s, config.vad_threshold, config.language) == (
        True, 0.8, 0.3, 0.5, "de")
    assert s2.stream(StreamConfig(step_s=1.0, policy=AlignAtt())).vad is False
    ga = s.as_dict(beta=False)
    assert ga["type"] == "transcription" and ga["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 800
    assert ga["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    json.dumps(ga)


def test_the_prompt_and_keywords_reach_the_stream():
    """``transcription.prompt``: the stream's first prompt (Whisper's initial_prompt); ``keywords``: its hotwords
    (faster-whisper's, in every decode's prompt); both reported back; bad keywords name the field."""
    s = update({"type": "transcription", "audio": {"input": {"transcription": {
        "prompt": "Printing in the fifteenth century.", "keywords": ["Lübeck", " Basel ", ""]}}}})
    config = s.stream(StreamConfig(step_s=0.5, policy=AlignAtt()))
    assert (config.prompt, config.hotwords) == ("Printing in the fifteenth century.", "Lübeck, Basel")
    assert s.as_dict(beta=False)["audio"]["input"]["transcription"]["keywords"] == ["Lübeck", "Basel"]
    beta = update({"input_audio_transcription": {"keywords": ["Lübeck"]}}, beta=True)
    assert beta.stream(StreamConfig(step_s=0.5, policy=AlignAtt())).hotwords == "Lübeck"
    cleared = update({"type": "transcription", "audio": {"input": {"transcription": {"keywords": None}}}}, s)
    assert cleared.keywords == () and cleared.prompt == s.prompt
    path = "session.audio.input.transcription.keywords"
    for bad in ("Lübeck", [1, 2], ["x" * 1001]):
        refused({"type": "transcription", "audio": {"input": {"transcription": {"keywords": bad}}}}, path)


def test_languages_restrict_detection():
    """``transcription.languages``: with no ``language``, detection chooses among them (the engine's
    ``StreamConfig.languages``); codes the model lacks are refused naming the field; null allows any again."""
    s = update({"type": "transcription", "audio": {"input": {"transcription": {"language": None,
                                                                              "languages": ["de", "fr", "de"]}}}})
    assert s.stream(StreamConfig(step_s=0.5, policy=AlignAtt())).languages == ("de", "fr") and s.stream(StreamConfig(step_s=0.5, policy=AlignAtt())).language is None
    assert s.as_dict(beta=False)["audio"]["input"]["transcription"]["languages"] == ["de", "fr"]
    assert update({"type": "transcription", "audio": {"input": {"transcription": {"languages": None}}}}, s).languages == ()
    path = "session.audio.input.transcription.languages"
    for bad in ("de", ["xx"], [3]):
        refused({"type": "transcription", "audio": {"input": {"transcription": {"languages": bad}}}}, path)


def test_beta_transcription_session_update_maps_onto_the_same_settings():
    s = update({"input_audio_format": "g711_ulaw", "input_audio_transcription": {"model": "whisper-1", "language": "fr"},
                "turn_detection": {"type": "server_vad", "threshold": 0.6, "prefix_padding_ms": 200},
                "input_audio_noise_reduction": {"type": "near_field"}, "modalities": ["text"]}, beta=True)
    assert (s.format, s.rate, s.language, s.vad, s.noise_reduction) == ("audio/pcmu", 8000, "fr", Vad(0.6, 200, 500),
                                                                        "near_field")
    beta = s.as_dict(beta=True)
    assert beta["input_audio_format"] == "g711_ulaw" and beta["turn_detection"]["threshold"] == 0.6
    refused({"input_audio_format": "mp3"}, "session.input_audio_format", beta=True)
    refused({"input_audio_format": ["pcm16"]}, "session.input_audio_format", beta=True)
    refused({"voice": "alloy"}, "session.voice", "unknown_parameter", beta=True)


def test_bad_settings_get_openai_errors_naming_the_field():
    refused({"type": "realtime"}, "session.type")
    refused({}, "session.type")
    refused({"type": "transcription", "instructions": "x"}, "session.instructions", "unknown_parameter")
    refused({"type": "transcription", "audio": {"output": {}}}, "session.audio.output", "unknown_parameter")
    inp = lambda **kw: {"type": "transcription", "audio": {"input": kw}}  # noqa: E731
    refused(inp(format={"type": "audio/flac"}), "session.audio.input.format.type")
    refused(inp(format={"type": "audio/pcm", "rate": 44100.0}), "session.audio.input.format.rate")
    refused(inp(format={"type": "audio/pcm", "rate": True}), "session.audio.input.format.rate")
    refused(inp(format={"type": "audio/pcmu", "rate": 24000}), "session.audio.input.format.rate")
    refused(inp(transcription={"language": "xx"}), "session.audio.input.transcription.language")
    refused(inp(transcription={"language": ["en"]}), "session.audio.input.transcription.language")
    refused(inp(turn_detection={"type": "semantic_vad"}), "session.audio.input.turn_detection.type")
    refused(inp(turn_detection={"type": "server_vad", "threshold": 2}), "session.audio.input.turn_detection.threshold")
    refused(inp(turn_detection={"type": "server_vad", "silence_duration_ms": 0.5}),
            "session.audio.input.turn_detection.silence_duration_ms")
    refused(inp(turn_detection="server_vad"), "session.audio.input.turn_detection", "invalid_type")
    refused({"type": "transcription", "include": ["item.input_audio_transcription.text"]}, "session.include")
    e = refused({"type": "transcription", "x" * 10_000: 1}, "session", "unknown_parameter")
    assert "10000 characters" in e.message
    assert update(inp(format={"type": "audio/pcm", "rate": 16000})).rate == 16000  # beyond OpenAI: any rate


def test_events_are_parsed_and_errors_have_openais_shape():
    assert parse_event('{"type": "input_audio_buffer.commit", "event_id": "e1"}')["event_id"] == "e1"
    for text, code, param in [("{", "invalid_json", None), ("[" * 5000, "invalid_json", None),
                              ('{"x": 1}', "missing_required_parameter", "type"),
                              ('{"type": "response.create"}', "invalid_value", "type"),
                              ('{"type": "input_audio_buffer.commit", "event_id": 5}', "invalid_type", "event_id")]:
        with pytest.raises(RealtimeError) as info:
            parse_event(text)
        assert (info.value.code, info.value.param) == (code, param), text[:40]
    event = error_event(info.value, "e9", "event_1")
    assert event == {"type": "error", "event_id": "event_1", "error": {
        "type": "invalid_request_error", "code": "invalid_type", "message": info.value.message, "param": "event_id",
        "event_id": "e9"}}
    assert error_event(ProtocolError("server_full", "full"), None, "event_2")["error"]["type"] == "server_error"


def test_appended_audio_must_be_base64():
    text = base64.b64encode(b"\x01\x02").decode()
    assert base64_audio(appended_audio({"audio": text}, Settings(), 8.0)) == b"\x01\x02"
    for audio, code in [(None, "missing_required_parameter"), (12, "invalid_type")]:
        with pytest.raises(RealtimeError) as info:
            appended_audio({"audio": audio} if audio is not None else {}, Settings(), 8.0)
        assert (info.value.code, info.value.param) == (code, "audio")
    for audio in ("not base64!", "QUJ"):
        with pytest.raises(RealtimeError) as info:
            base64_audio(appended_audio({"audio": audio}, Settings(), 8.0))
        assert (info.value.code, info.value.param) == ("invalid_value", "audio")


@pytest.mark.parametrize("settings", [Settings(), Settings(format="audio/pcmu", rate=8000),
                                      Settings(format="audio/pcma", rate=8000), Settings(rate=8000),
                                      Settings(rate=192000)], ids=["pcm24k", "pcmu", "pcma", "pcm8k", "pcm192k"])
def test_an_append_holds_at_most_the_limit_in_seconds_of_its_format(settings):
    """The limit is seconds of audio whatever the format (G.711's 8 kHz bytes hold 6 times the audio of 24 kHz PCM's);
    it is read from the base64 text's length, before anything is decoded."""
    per_second = 8000 if settings.format != "audio/pcm" else 2 * settings.rate
    fits = bytes(int(8.0 * per_second))
    assert base64_audio(appended_audio({"audio": base64.b64encode(fits).decode()}, settings, 8.0)) == fits
    for extra in (1, 2, 3, per_second):  # one byte over (each base64 padding), and a second over
        with pytest.raises(RealtimeError) as info:
            appended_audio({"audio": base64.b64encode(fits + bytes(extra)).decode()}, settings, 8.0)
        e = info.value
        assert (e.code, e.param) == ("invalid_value", "audio") and "at most 8 s" in e.message, e.message
        assert "dropped" in e.message and len(e.message) < 300, e.message


def test_audio_formats_decode_to_16_khz():
    pcm = (np.sin(np.arange(24000) / 10) * 10000).astype("<i2")
    decoder = RealtimeAudio(Settings())
    out = np.concatenate([decoder(pcm.tobytes()), decoder.finish()])
    assert abs(len(out) - 16000) < 200 and out.dtype == np.float32
    with pytest.raises(RealtimeError) as info:
        RealtimeAudio(Settings())(b"\x00\x01\x02")  # half a sample
    assert info.value.param == "audio"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    codes = bytes(range(256))
    assert np.array_equal(G711["audio/pcmu"], np.frombuffer(audioop.ulaw2lin(codes, 2), "<i2"))
    assert np.array_equal(G711["audio/pcma"], np.frombuffer(audioop.alaw2lin(codes, 2), "<i2"))
    ulaw = RealtimeAudio(Settings(format="audio/pcmu", rate=8000))(audioop.lin2ulaw(pcm[:8000].tobytes(), 2))
    assert 14000 < len(ulaw) <= 16000  # 8 kHz -> 16 kHz (the resampler holds back its last few ms)


def test_delay_levels_set_alignatts_margins_and_ignored_fields_are_named():
    """``transcription.delay`` picks AlignAtt's margins (medium: the server's own); an unknown level is refused
    naming the field. The fields accepted without effect are listed for warning events, GA and beta alike."""
    from asr_spec.server.realtime_events import DELAYS, ignored_fields

    from asr_spec.streaming.config import StreamConfig

    s = update({"type": "transcription", "audio": {"input": {"transcription": {"delay": "xhigh"}}}})
    assert s.stream(StreamConfig(step_s=0.5, policy=AlignAtt())).policy == DELAYS["xhigh"] == AlignAtt(2.0, 0.95, 6.0)
    assert s.stream(StreamConfig(step_s=0.5, policy=LocalAgreement())).policy == LocalAgreement()  # a delay sets AlignAtt's margins only
    assert s.as_dict(beta=False)["audio"]["input"]["transcription"]["delay"] == "xhigh"
    medium = update({"type": "transcription", "audio": {"input": {"transcription": {"delay": "medium"}}}})
    assert medium.stream(StreamConfig(step_s=0.5, policy=AlignAtt())) == Settings().stream(StreamConfig(step_s=0.5, policy=AlignAtt()))  # medium: the server's own margins
    assert DELAYS["medium"] == StreamConfig().policy
    margins = [DELAYS[k].margin_s for k in ("minimal", "low", "medium", "high", "xhigh")]
    assert margins == sorted(margins) and len(set(margins)) == 5
    refused({"type": "transcription", "audio": {"input": {"transcription": {"delay": "fast"}}}},
            "session.audio.input.transcription.delay")
    event = {"type": "session.update", "session": {"type": "transcription", "expires_at": 0, "audio": {"input": {
        "turn_detection": {"type": "server_vad", "eagerness": "low", "create_response": False},
        "noise_reduction": {"type": "near_field"}}}}}
    assert [p for p, _ in ignored_fields(event)] == [
        "session.expires_at", "session.audio.input.turn_detection.create_response",
        "session.audio.input.turn_detection.eagerness", "session.audio.input.noise_reduction"]
    beta = {"type": "transcription_session.update", "session": {"modalities": ["text"], "turn_detection": {
        "type": "server_vad", "interrupt_response": True}, "input_audio_noise_reduction": None}}
    assert [p for p, _ in ignored_fields(beta)] == ["session.modalities",
                                                    "session.audio.input.turn_detection.interrupt_response"]
    assert ignored_fields({"type": "session.update", "session": {"type": "transcription"}}) == []


def test_a_native_start_message_names_its_commit_policy_and_gets_the_policy_object():
    """The native protocol's ``commit_policy`` (docs/protocol.md) is a name on the wire and a policy object inside;
    none given: the server's; an unknown name is refused."""
    from asr_spec.server.protocol import parse_start

    assert parse_start({"type": "start", "commit_policy": "local-agreement"}, None).commit_policy == LocalAgreement()
    assert parse_start({"type": "start", "commit_policy": "alignatt"}, None).commit_policy == AlignAtt()
    assert parse_start({"type": "start"}, None).commit_policy is None
    with pytest.raises(ProtocolError, match="commit_policy must be one of alignatt, local-agreement"):
        parse_start({"type": "start", "commit_policy": "eager"}, None)
