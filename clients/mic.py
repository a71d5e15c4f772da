"""``asr_spec mic``: live microphone transcription in the terminal, through ``asr_spec serve`` (``--url``)
or the streaming engine in this process. Committed text is printed plainly, the changing partial dimmed
on the same line; Ctrl-C finalizes and prints the whole transcript."""
from __future__ import annotations

import json
import queue
import shutil
import sys
import threading
import time

import numpy as np

from asr_spec.audio import SAMPLE_RATE as RATE

BLOCK = RATE // 10  # 100 ms blocks
DIM, RESET, CLEAR = "\033[2m", "\033[0m", "\r\033[K"


class MicError(Exception):
    """No PortAudio, no input device, or a device that cannot be opened: said plainly."""


def _sounddevice():
    try:
        import sounddevice
    except OSError as e:  # the wheel needs the PortAudio library on Linux
        raise MicError(f"PortAudio is not available ({e}); install it, e.g. `sudo apt-get install libportaudio2`") from None
    return sounddevice


def list_devices() -> str:
    sd = _sounddevice()
    rows = [f"{i:3d}  {d['name']}  ({d['max_input_channels']} in, {d['default_samplerate']:.0f} Hz)"
            for i, d in enumerate(sd.query_devices()) if d["max_input_channels"] > 0]
    if not rows:
        raise MicError("no audio input device found")
    return "\n".join(rows)


class Microphone:
    """16 kHz mono float32 blocks from an input device, into a queue."""

    def __init__(self, device: str | int | None = None):
        sd = _sounddevice()
        self.blocks: queue.Queue = queue.Queue()
        try:
            info = sd.query_devices(device, kind="input")
        except (ValueError, sd.PortAudioError) as e:
            raise MicError(f"no usable audio input device{f' {device!r}' if device is not None else ''}: {e}") from None
        try:
            self.stream = sd.InputStream(samplerate=RATE, channels=1, dtype="float32", blocksize=BLOCK,
                                         device=device, callback=lambda data, *_: self.blocks.put(data[:, 0].copy()))
        except sd.PortAudioError as e:
            raise MicError(f"cannot open {info['name']!r} at 16 kHz: {e}") from None

    def __enter__(self) -> "Microphone":
        self.stream.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stream.stop()
        self.stream.close()


class FileSource:
    """A stand-in microphone: a file replayed at real time (tests, demos without a sound card)."""

    def __init__(self, path: str):
        from asr_spec.audio import load_audio

        self.audio = load_audio(path)
        self.blocks: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._play, daemon=True)

    def _play(self) -> None:
        t0 = time.monotonic()
        for i in range(0, len(self.audio), BLOCK):
            time.sleep(max(0.0, t0 + i / RATE - time.monotonic()))
            self.blocks.put(self.audio[i:i + BLOCK])
        while True:  # then silence, like a quiet room
            time.sleep(BLOCK / RATE)
            self.blocks.put(np.zeros(BLOCK, dtype=np.float32))

    def __enter__(self) -> "FileSource":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        pass


class LiveLine:
    """Terminal display: finals printed plainly (wrapped), the partial dimmed after them on the same line."""

    def __init__(self, out=sys.stdout):
        self.out = out
        self.line = ""  # committed text on the current terminal line
        self.text = ""  # every final so far, each joined as the server says (``join``)
        self.tty = out.isatty()
        self.partial_join = " "

    def event(self, e: dict) -> None:
        if e["type"] == "final":
            if e["text"]:
                self.text += e.get("join", " " if self.text else "") + e["text"]
                self.line = (self.line + e.get("join", " ") + e["text"]).lstrip()
            self._draw("")
            if e.get("end_of_utterance") and self.line:
                self.out.write("\n")
                self.line = ""
        elif e["type"] == "partial":
            self.partial_join = e.get("join", " ") if self.line else ""
            self._draw(e["text"])
        elif e["type"] == "error":
            print(f"\nerror {e['code']}: {e['message']}", file=sys.stderr)

    def _draw(self, partial: str) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        while len(self.line) >= width:  # wrap committed text onto finished lines
            cut = self.line.rfind(" ", 0, width) if " " in self.line[:width] else width
            self.out.write(CLEAR + self.line[:cut] + "\n")
            self.line = self.line[cut:].lstrip()
        tail = partial[: max(0, width - len(self.line) - 2)]
        if self.tty:
            self.out.write(CLEAR + self.line + (self.partial_join + DIM + tail + RESET if tail else ""))
        elif not partial:
            self.out.write(CLEAR + self.line)
        self.out.flush()

    @property
    def transcript(self) -> str:
        return self.text


def run_remote(url: str, source, display: LiveLine, language: str | None, api_key: str | None,
               policy: str | None = None) -> None:
    from asr_spec.clients.stream import connect_session

    with connect_session(url, api_key) as ws:
        start = {"type": "start", "sample_rate": RATE, "encoding": "f32le", "channels": 1, "language": language}
        ws.send(json.dumps(start | ({"commit_policy": policy} if policy else {})))
        done = threading.Event()

        def receive():
            try:
                for message in ws:
                    e = json.loads(message)
                    display.event(e)
                    if e["type"] == "closed":
                        break
            except Exception:
                pass
            done.set()

        threading.Thread(target=receive, daemon=True).start()
        try:
            while not done.is_set():
                try:
                    ws.send(source.blocks.get(timeout=0.5).astype("<f4").tobytes())
                except queue.Empty:
                    pass
        except KeyboardInterrupt:
            ws.send(json.dumps({"type": "close"}))
            done.wait(120)


def run_local(engine, source, display: LiveLine, language: str | None, policy: str | None = None) -> None:
    """Stream the microphone through an in-process engine; ``policy``: a commit policy's name (None: the default)."""
    from asr_spec.streaming.config import StreamConfig
    from asr_spec.streaming.policy import policy_named

    sid = engine.open(StreamConfig(language=language, **({"policy": policy_named(policy)} if policy else {})))
    try:
        while True:
            try:
                engine.feed(sid, source.blocks.get(timeout=0.5))
            except queue.Empty:
                pass
            while not source.blocks.qsize() and engine.poll():
                for e in engine.step().get(sid, []):
                    display.event(e.as_dict())
                    if e.type == "error":
                        return
    except KeyboardInterrupt:
        engine.flush(sid, close=True)
        while engine.poll():
            for e in engine.step().get(sid, []):
                display.event(e.as_dict())
    finally:
        engine.close(sid)
