"""OpenAI's Realtime API in transcription mode at ``/v1/realtime?intent=transcription`` (docs/realtime.md): JSON events
in and out, on the same engine, limits and backpressure as the native protocol (:class:`StreamSession`).

A turn is one conversation item. It opens with the first text the engine hears (``speech_started``, server VAD) or
with a commit, takes every ``final`` as a transcription delta (committed text, never retracted: the deltas of a turn
add up to its transcript), and ends at the engine's end of utterance: silence (server VAD, silero) or the flush a
client's ``input_audio_buffer.commit`` asks for.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from asr_spec.server.protocol import ProtocolError
from asr_spec.server.realtime_events import (
    UPDATES,
    RealtimeAudio,
    RealtimeError,
    Settings,
    appended_audio,
    base64_audio,
    error_event,
    ignored_fields,
    item,
    parse_event,
    parse_update,
)
from asr_spec.server.session import Message, StreamSession
from asr_spec.server.shared import Shared
from starlette.websockets import WebSocket

from asr_spec.streaming.events import Event
from asr_spec.streaming.policy import AlignAtt

BETA_PROTOCOL = "openai-beta.realtime-v1"
MIN_COMMIT_S = 0.1  # OpenAI refuses to commit less audio than this


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


@dataclass
class Turn:
    item: str
    start: float  # stream seconds where its audio begins
    text: str = ""  # the deltas sent so far
    committed: bool = False  # input_audio_buffer.committed has been sent
    previous: str | None = None  # the item before it
    logprobs: list[dict] = field(default_factory=list)  # its text tokens' log-probabilities (include: logprobs)


class RealtimeSession(StreamSession):
    first_message = "session.update"
    protocol = "realtime"

    def __init__(self, shared: Shared, ws: WebSocket):
        super().__init__(shared, ws)
        self.offered = [p.strip() for p in ws.scope.get("subprotocols", [])]
        self.beta = ws.headers.get("openai-beta", "").replace(" ", "") == "realtime=v1" or BETA_PROTOCOL in self.offered
        self.settings = Settings()
        self.id = new_id("sess")
        self.turn: Turn | None = None
        self.previous_item: str | None = None
        self.turn_end = 0.0  # stream seconds where the last turn ended
        self.commits = 0  # turns committed by the client whose end has not been decoded yet
        self.commit_flush = 0  # the flush the last commit asked for
        self.discard_until = 0  # after a clear: the flush before which the engine's events are dropped

    # --- handshake ------------------------------------------------------------------------------------------
    async def accept(self) -> None:
        await self.ws.accept(subprotocol="realtime" if "realtime" in self.offered else None)

    async def run(self) -> None:
        self.emit("transcription_session.created" if self.beta else "session.created", session=self.session_object())
        await super().run()

    # --- events out -----------------------------------------------------------------------------------------
    def emit(self, kind: str, **fields) -> None:
        """Queue a server event (in order with the engine's)."""
        self.outbox.put_nowait({"type": kind, "event_id": new_id("event"), **fields})

    def error_event(self, e: ProtocolError) -> dict:
        return error_event(e, getattr(e, "event_id", None), new_id("event"))

    def session_object(self) -> dict:
        return {"id": self.id, **self.settings.as_dict(self.beta)}

    def _deliver(self, events, flushes: int) -> None:
        """Events of audio cleared from the buffer are dropped (the engine's errors are not)."""
        dropping = self.flushes_delivered < self.discard_until
        super()._deliver([e for e in events if not dropping or e.type == "error"], flushes)

    def translate(self, e: Event) -> list[dict]:
        """Queue (``emit``) what one engine event means for the turn; nothing more to send."""
        if e.type == "error":
            if self.turn is not None:
                self.emit("conversation.item.input_audio_transcription.failed", item_id=self.turn.item,
                          content_index=0, error={"type": "server_error", "code": "decode_failed", "message": e.text})
                self.turn = None
            return [self.error_event(ProtocolError("decode_failed", e.text))]
        ends = e.type == "final" and e.end_of_utterance
        if self.turn is None and (e.text or (ends and self.commits)):
            self._open_turn(e.start)
        if e.type == "final" and e.text:
            delta = (e.join if self.turn.text else "") + e.text
            self.turn.text += delta
            self.turn.logprobs += [{"token": token, "logprob": lp, "bytes": list(token.encode())}
                                   for token, lp in e.logprobs or []]
            self.emit("conversation.item.input_audio_transcription.delta", item_id=self.turn.item, content_index=0,
                      delta=delta)
        if ends and self.turn is not None:
            self._end_turn(e.end)
        return []

    def _open_turn(self, start: float, heard: bool = True) -> None:
        """A new item; ``heard``: the engine heard speech (server VAD says so), rather than a client's commit."""
        self.turn = Turn(new_id("item"), start)
        if self.settings.vad is not None and heard:
            self.emit("input_audio_buffer.speech_started", audio_start_ms=round(1000 * start), item_id=self.turn.item)

    def _commit_turn(self, end: float | None) -> None:
        """``input_audio_buffer.committed`` and the item's creation (``end``: where VAD found the speech ended)."""
        turn = self.turn
        if end is not None and self.settings.vad is not None:
            self.emit("input_audio_buffer.speech_stopped", audio_end_ms=round(1000 * end), item_id=turn.item)
        turn.previous, turn.committed, self.previous_item = self.previous_item, True, turn.item
        self.emit("input_audio_buffer.committed", item_id=turn.item, previous_item_id=turn.previous)
        self.emit("conversation.item.created" if self.beta else "conversation.item.added",
                  previous_item_id=turn.previous, item=item(turn.item, None))

    def _end_turn(self, end: float) -> None:
        turn = self.turn
        if not turn.committed:
            self._commit_turn(None if self.commits else end)
        self.commits = max(0, self.commits - 1)
        completed = {"item_id": turn.item, "content_index": 0, "transcript": turn.text,
                     "usage": {"type": "duration", "seconds": round(max(0.0, end - turn.start), 3)}}
        if self.settings.logprobs:
            completed["logprobs"] = turn.logprobs
        self.emit("conversation.item.input_audio_transcription.completed", **completed)
        if not self.beta:
            self.emit("conversation.item.done", previous_item_id=turn.previous, item=item(turn.item, turn.text))
        self.turn, self.turn_end = None, max(self.turn_end, end)

    # --- client events --------------------------------------------------------------------------------------
    async def handle(self, msg: Message) -> bool:
        event: dict = {}
        try:
            if msg.get("bytes") is not None:
                raise RealtimeError("invalid_value", "binary messages are not part of the Realtime API: send audio "
                                    "as input_audio_buffer.append events")
            event = parse_event(msg.get("text") or "")
            await self._dispatch(event)
        except ProtocolError as e:
            e.event_id = event.get("event_id")  # the error names the client event it answers
            raise
        return False

    async def _dispatch(self, event: dict) -> None:
        kind = event["type"]
        if kind in UPDATES:
            await self._update(event)
        elif self.sid is None:
            if kind != "input_audio_buffer.clear":
                raise RealtimeError("session_not_configured", f"send session.update (session.type \"transcription\")"
                                    f" before {kind}")
            self.emit("input_audio_buffer.cleared")
        elif kind == "input_audio_buffer.append":
            # checked here (its length says how much audio it holds); decoded and fed in a session thread
            audio, decoder = appended_audio(event, self.settings, self.config.max_append_s), self.decoder
            await self._feed(lambda: decoder(base64_audio(audio)))
        else:
            with self._atomic():
                await (self._commit() if kind == "input_audio_buffer.commit" else self._clear())

    async def _update(self, event: dict) -> None:
        """New settings. A change of language, turn detection, prompt or keywords needs a new engine stream: what the old one holds is
        committed and decoded first (the reader waits meanwhile)."""
        with self._atomic():
            old, new = self.settings, parse_update(event, self.settings, self.shared.languages)
            self.beta = self.beta or event["type"] == "transcription_session.update"
            stream, restart = new.stream(self.config.stream), False
            if self.sid is not None:
                restart = stream != old.stream(self.config.stream)
                if restart or (new.format, new.rate) != (old.format, old.rate):
                    await self._end_audio(None)
            if restart:
                if self.turn is not None and not self.turn.committed:
                    self._commit_turn(None)
                    self.commits += 1
                done = await self._flush(close=True)
        if restart:  # the old stream's events are delivered meanwhile
            await self._until_flushed(done, self.config.flush_timeout_s, read=False)
        with self._atomic():
            if restart:
                await self._close_stream()
                self.commits, self.turn, self.turn_end = 0, None, 0.0
            if self.sid is None or restart:
                await self._open(stream)
            self.settings = new
            self.decoder = self.decoder or RealtimeAudio(new)
            self.emit("transcription_session.updated" if event["type"] == "transcription_session.update"
                      else "session.updated", session=self.session_object())
            ignored = ignored_fields(event)
            if new.delay and not isinstance(self.config.stream.policy, AlignAtt):
                ignored.append(("session.audio.input.transcription.delay", f"it sets AlignAtt's margins, and this "
                                f"server commits by {self.config.stream.policy.name}"))
            for param, why in ignored:
                self.emit("warning", warning={"code": "ignored_parameter", "param": param,
                                              "message": f"{param} is accepted but has no effect: {why}"})

    async def _commit(self) -> None:
        engine, pending = self.shared.engine, self.flushes_delivered < self.commit_flush
        if self.turn is None and not pending and await self._call(engine.backlog_s, self.sid) < MIN_COMMIT_S:
            raise RealtimeError("input_audio_buffer_commit_empty", f"the input audio buffer holds less than "
                                f"{1000 * MIN_COMMIT_S:g} ms of audio to commit")
        await self._end_audio(self.settings)
        self.commit_flush = await self._flush(close=True)  # never deferred, unlike a native finalize of under 1 s
        if pending and self.turn is not None and self.turn.committed:
            return  # the pending commit's flush now takes this audio too: one item
        if self.turn is None:
            self._open_turn(self.turn_end, heard=False)
        if not self.turn.committed:
            self._commit_turn(None)
            self.commits += 1

    async def _clear(self) -> None:
        """Drop the buffered audio. Text already sent as deltas cannot be taken back: an open turn is completed with
        it; the engine's events for the rest of the cleared audio are dropped."""
        if self.turn is not None:
            self.commits = max(self.commits, 1)  # it ends as a commit's turn would (no speech_stopped)
            stats = await self._call(self.shared.engine.stream_stats, self.sid) or {}
            self._end_turn(stats.get("audio_seconds", self.turn.start))
        self.commits = 0
        await self._end_audio(self.settings)
        self.discard_until = await self._flush(close=True)
        self.emit("input_audio_buffer.cleared")

    async def _end_audio(self, settings: Settings | None) -> None:
        """Feed what the resampler still holds, and start a new one for ``settings`` (None: later)."""
        await self._feed(self.decoder.finish, received=False)
        self.decoder = RealtimeAudio(settings) if settings is not None else None
