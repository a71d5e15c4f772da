"""Bounded audio decoding (issue 25): a file's length, rate and channels are checked from its header before it is
decoded, decoding stops at the limit when the header does not say the length, files are decoded and resampled a
block at a time with the same samples as the whole-array path, and ``transcribe`` holds the windows in flight, not
the file, with the same tokens."""
from __future__ import annotations

import io
import time
import tracemalloc

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from conftest import DEV

from asr_spec.audio import SAMPLE_RATE, AudioError, AudioFile, AudioTooLong, Cursor, decode_audio, load_audio
from asr_spec.features import N_FRAMES, Features, log_mel
from asr_spec.recognizer import Checks
from asr_spec.transcribe import TranscribeOptions, Transcriber

JFK = DEV / "jfk-inaugural-1961-ask-not.wav"
LONG = DEV / "longform" / "ljspeech-LJ001-0001_to_LJ001-0032.wav"


def _flac_claiming(path, frames: int, seconds: float, rate: int, channels: int) -> None:
    """A short FLAC whose STREAMINFO says ``frames`` frames (0: unknown, as a streamed encoder writes)."""
    x = np.zeros((int(seconds * rate), channels), np.float32)
    x[:, :] = 0.1 * np.sin(np.arange(len(x)) / 7.0)[:, None]
    buf = io.BytesIO()
    sf.write(buf, x, rate, format="FLAC")
    data = bytearray(buf.getvalue())
    at = 8 + 10  # after "fLaC" and the block header: rate (20 bits), channels (3), bits (5), total samples (36)
    fields = int.from_bytes(data[at:at + 8], "big")
    data[at:at + 8] = ((fields & ~((1 << 36) - 1)) | frames).to_bytes(8, "big")
    path.write_bytes(bytes(data))


def _words_only(message: str) -> None:
    assert "object at 0x" not in message and "<" not in message, message


def test_ten_minutes_at_192_khz_stereo_is_refused_from_the_header(tmp_path):
    f = tmp_path / "long.flac"
    _flac_claiming(f, 10 * 60 * 192000, 1.0, 192000, 2)  # decoding it would find 1 s: the header alone refuses it
    for file in (f, io.BytesIO(f.read_bytes())):
        t0 = time.perf_counter()
        with pytest.raises(AudioTooLong) as e:
            decode_audio(file, "upload.flac", max_seconds=300)
        assert time.perf_counter() - t0 < 0.5
        assert str(e.value) == "upload.flac: 600 s of audio, more than the limit of 300 s"


def test_a_header_without_the_length_is_stopped_at_the_limit(tmp_path):
    f = tmp_path / "streamed.flac"
    _flac_claiming(f, 0, 20.0, 16000, 1)
    assert sf.info(str(f)).frames > 10**18  # libsndfile: length unknown
    with pytest.raises(AudioTooLong, match="more than the limit of 5 s of audio"):
        decode_audio(f, max_seconds=5)


@pytest.mark.parametrize("rate, channels, words", [(500, 1, "sample rate 500 Hz is outside 1000..192000 Hz"),
                                                   (200000, 1, "sample rate 200000 Hz is outside"),
                                                   (16000, 17, "17 channels (at most 16)")])
def test_odd_rates_and_channel_counts_are_refused_from_the_header(tmp_path, rate, channels, words):
    f = tmp_path / "odd.wav"
    sf.write(f, np.full((100, channels), 0.1, np.float32), rate)
    with pytest.raises(AudioError, match=words.replace("(", r"\(").replace(")", r"\)")):
        AudioFile(io.BytesIO(f.read_bytes()), "odd.wav")


def test_undecodable_data_is_named_in_words():
    with pytest.raises(AudioError) as e:
        decode_audio(io.BytesIO(b"RIFF not really audio" * 10), "noise.wav", max_seconds=60)
    assert str(e.value).startswith("noise.wav: cannot decode audio: not a WAV, FLAC, OGG (Vorbis, Opus) or MP3 file")
    _words_only(str(e.value))


def test_blocks_give_the_whole_array_samples(tmp_path):
    """A dev file, and the same speech as a 44.1 kHz stereo FLAC: bit for bit the samples of decoding the whole file
    at once, mixing it down and resampling it in one call (the path before blocks)."""
    speech, _ = sf.read(JFK, dtype="float32")
    stereo = np.stack([soxr.resample(speech, 16000, 44100), 0.5 * soxr.resample(speech, 16000, 44100)], axis=1)
    sf.write(tmp_path / "jfk.flac", stereo, 44100)
    for f in (JFK, tmp_path / "jfk.flac"):
        whole, rate = sf.read(f, dtype="float32", always_2d=True)
        mono = whole.mean(axis=1)
        expected = mono if rate == SAMPLE_RATE else soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ")
        assert np.array_equal(load_audio(f), expected)
        assert np.array_equal(decode_audio(io.BytesIO(f.read_bytes()), "x", max_seconds=60), expected)
        assert np.array_equal(np.concatenate(list(AudioFile(f).blocks())), expected)


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_decoding_a_long_file_holds_the_output_and_a_block(tmp_path):
    """10 min at 48 kHz: the whole file at its own rate would be 115 MB of float32; decoding it holds the 38 MB at
    16 kHz and a block."""
    f = tmp_path / "long.flac"
    rate, seconds = 48000, 600
    with sf.SoundFile(f, "w", rate, 1, format="FLAC") as out:
        tone = (0.1 * np.sin(np.arange(rate * 10) / 5.0)).astype(np.float32)
        for _ in range(seconds // 10):
            out.write(tone)
    tracemalloc.start()
    try:
        audio = decode_audio(f, max_seconds=3600)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(audio) == seconds * SAMPLE_RATE
    assert peak < audio.nbytes + 8e6 < seconds * rate * 4 / 2, peak


def test_features_are_log_mel_bit_for_bit():
    """:class:`Features` (a block at a time, from the file) against :func:`log_mel` of the whole array, at many
    seeks and window widths, for 80 and 128 mel bins."""
    for path in (JFK, LONG):
        audio = load_audio(path)
        for n_mels in (80, 128):
            whole = log_mel(audio, n_mels)
            features = Features(AudioFile(path), n_mels)
            assert features.frames == whole.shape[1] - N_FRAMES and features.length == len(audio)
            seeks = sorted(s for s in {0, 1, 2999, 3000, 6001, features.frames - 1, *range(0, features.frames, 1777)}
                           if s < features.frames)  # Whisper's seek stays in the audio
            for seek in seeks:
                for frames in (N_FRAMES, 1200):
                    assert torch.equal(features.window(seek, frames), whole[:, seek:seek + frames]), (path, seek)


def test_a_cursor_reads_forward_and_forgets():
    blocks = [np.arange(i, i + 7, dtype=np.float32) for i in range(0, 70, 7)]
    cursor = Cursor(iter(blocks))
    assert np.array_equal(cursor.take(3, 12), np.arange(3, 12))
    assert np.array_equal(cursor.take(5, 9), np.arange(5, 9))
    assert np.array_equal(cursor.take(40, 45), np.arange(40, 45)) and cursor.length is None
    assert np.array_equal(cursor.take(66, 74), [66, 67, 68, 69, 0, 0, 0, 0]) and cursor.length == 70
    with pytest.raises(ValueError, match="forward only"):
        cursor.take(10, 20)


def _speech_file(tmp_path, minutes: float) -> tuple[object, np.ndarray]:
    """``minutes`` of JFK's sentence with 2 s pauses, as a 44.1 kHz FLAC (and its audio at 16 kHz)."""
    jfk, _ = sf.read(JFK, dtype="float32")
    one = np.concatenate([jfk, np.zeros(2 * 16000, np.float32)])
    x = np.tile(one, int(minutes * 60 * 16000 / len(one)) + 1)
    f = tmp_path / "talk.flac"
    sf.write(f, soxr.resample(x, 16000, 44100), 44100)
    return f, load_audio(f)


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_transcribe_holds_the_windows_not_the_file(short_target, tmp_path):
    """A 10-minute file read a block at a time: the same tokens as its whole array, holding a few copies of a
    window's audio (its 16 kHz array is 38 MB; the features are torch's, made a 30 s block at a time)."""
    f, audio = _speech_file(tmp_path, 10)
    tr = Transcriber(short_target)
    o = TranscribeOptions(language="en", timestamps=False, checks=Checks(temperatures=(0.0,)))
    whole = tr.transcribe(audio, o)
    tracemalloc.start()
    try:
        lazy = tr.transcribe(AudioFile(f), o)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [s.tokens for s in lazy.segments] == [s.tokens for s in whole.segments] and lazy.text == whole.text
    assert whole.stats.windows >= 20 and lazy.stats.audio_seconds == whole.stats.audio_seconds
    assert peak < 12e6 < audio.nbytes / 3, peak


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_chunked_reads_each_piece_in_order(short_target, tmp_path):
    f, audio = _speech_file(tmp_path, 1)
    tr = Transcriber(short_target)
    o = TranscribeOptions(language="en", chunked=True, checks=Checks(temperatures=(0.0,)))
    whole, lazy = tr.transcribe(audio, o), tr.transcribe(AudioFile(f), o)
    assert len(whole.segments) > 3 and [s.tokens for s in lazy.segments] == [s.tokens for s in whole.segments]
    assert lazy.stats.audio_seconds == whole.stats.audio_seconds == pytest.approx(len(audio) / SAMPLE_RATE)


def test_a_bad_file_is_reported_by_transcribe_many(short_target, tmp_path):
    silent = tmp_path / "silent.flac"
    sf.write(silent, np.zeros(16000 * 40, np.float32), 16000)
    tr = Transcriber(short_target)
    o = TranscribeOptions(language="en", checks=Checks(temperatures=(0.0,)))
    (key, result), = tr.transcribe_many([("s", lambda: AudioFile(silent))], o)
    assert key == "s" and isinstance(result, AudioError) and "silent (digital silence)" in str(result)
