"""The streaming encoder (fast, tiny random models): frames encoded a bounded number of times, frozen positions
kept bit for bit, the decoders' cross-attention keys and values kept with them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from asr_spec.features import log_mel, window
from asr_spec.models.stream_encoder import EncoderCache, encode_tail, first_frame
from asr_spec.recognizer import Recognizer
from asr_spec.streaming.encoding import BufferEncoder


def _audio(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)


def test_with_nothing_frozen_it_is_the_encoder(tiny_target):
    mel = window(log_mel(_audio(3)), 0, 400)[None]
    encoder = tiny_target.encoder.inner
    assert torch.equal(encode_tail(encoder, mel, EncoderCache(), freeze=0), encoder(mel))


def test_frozen_positions_keep_their_states_and_the_rest_attends_to_them(tiny_target):
    """Positions frozen at one step are returned unchanged later, the newer ones computed over them: what a
    second call computes from frame ``first_frame`` on equals the whole computation with the cache."""
    encoder = tiny_target.encoder.inner
    mel = window(log_mel(_audio(6)), 0, 600)[None]
    cache = EncoderCache()
    first = encode_tail(encoder, mel[:, :, :400], cache, freeze=150)
    assert cache.frozen == 150 and len(cache.keys) == len(encoder.layers)
    again = encode_tail(encoder, mel[:, :, first_frame(cache):], cache, freeze=250)
    assert again.shape[1] == 300 and cache.frozen == 250
    assert torch.equal(again[:, :150], first[:, :150])  # frozen: not recomputed
    assert not torch.allclose(again[:, 150:200], first[:, 150:200])  # re-encoded: they now hear what followed
    whole = encoder(mel)
    assert not torch.allclose(again, whole)  # the frozen positions never heard the last 2 s (the trade)
    cache.truncate(100)
    assert cache.frozen == 100 and cache.keys[0].shape[2] == 100


def test_a_buffer_grows_step_by_step_and_restarts_when_trimmed(tiny_target):
    rec = Recognizer(tiny_target)
    enc = BufferEncoder(rec, lookahead_s=1.0, pad_s=1.0)
    audio = _audio(8)
    outs = [enc.encode(audio[:int(s * 16000)], start=0.0) for s in (2.0, 2.5, 3.0)]
    assert [o.positions for o in outs] == [150, 175, 200]  # audio + 1 s of silence, 50 positions a second
    assert enc.cache.frozen == 100  # 3 s heard: all but the last second (the lookahead) frozen
    assert torch.equal(outs[2].memory[:, :75], outs[1].memory[:, :75])  # frozen at 2.5 s
    keys, values = outs[2].cross
    fresh_keys, fresh_values = tiny_target.decoder.cross_kv(outs[2].memory)
    for a, b in zip(keys + values, fresh_keys + fresh_values):
        torch.testing.assert_close(a, b)  # the kept keys and values are those of the memory returned
    enc.encode(audio[16000:int(3.5 * 16000)], start=1.0)  # the buffer lost its first second: encoded afresh
    assert enc.start == 1.0 and enc.cache.frozen == 75


def test_a_full_window_keeps_to_whisper_s_1500_positions(tiny_target):
    """A 30 s buffer (a window commit) has no room for the silence after it: it is encoded as Whisper's own window."""
    enc = BufferEncoder(Recognizer(tiny_target), lookahead_s=1.0, pad_s=1.0)
    assert enc.encode(_audio(30), start=0.0).positions == 1500


@pytest.mark.parametrize("compute_type", ["float32", "int8_float32"])
def test_buffers_encoded_together_get_what_each_gets_alone(tiny_dir, compute_type):
    """One engine tick encodes every due stream's new audio in one encoder forward (encode_buffers): each stream's
    encoder output and kept cross-attention keys equal what encoding it alone gives, over steps that grow, freeze
    and trim its buffer, streams of different lengths side by side. Bit for bit where the linear layers are row-exact
    (int8); within float rounding else."""
    from asr_spec.models.compute import int8_kernels
    from asr_spec.models.loader import load_target
    from asr_spec.streaming.encoding import encode_buffers

    if compute_type.startswith("int8") and not int8_kernels("cpu"):
        pytest.skip("no int8 CPU kernels here")
    rec = Recognizer(load_target(str(tiny_dir), compute_type=compute_type))
    audios = [_audio(9, seed) for seed in range(3)]
    alone = [BufferEncoder(rec, lookahead_s=1.0, pad_s=1.0) for _ in audios]
    together = [BufferEncoder(rec, lookahead_s=1.0, pad_s=1.0) for _ in audios]
    steps = [((2.0, 0.0), (1.0, 0.0), (3.5, 0.0)), ((2.5, 0.0), (2.0, 0.0), (4.0, 0.0)),
             ((4.0, 1.0), (2.5, 0.0), (4.5, 0.0))]  # (seconds held, buffer start); the first stream trims at step 3
    for step in steps:
        cut = [a[int(start * 16000):int(end * 16000)] for a, (end, start) in zip(audios, step)]
        one = [e.encode(x, start) for e, x, (_, start) in zip(alone, cut, step)]
        many = encode_buffers([(e, x, start) for e, x, (_, start) in zip(together, cut, step)])
        for a, b in zip(one, many):
            pairs = [(a.memory, b.memory)] + list(zip(a.cross.keys + a.cross.values, b.cross.keys + b.cross.values))
            for x, y in pairs:
                assert x.shape == y.shape
                if compute_type.startswith("int8"):
                    assert torch.equal(x, y)
                else:
                    torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    assert [e.cache.frozen for e in together] == [e.cache.frozen for e in alone]


def test_full_windows_are_encoded_in_one_call_the_same_alone_or_in_company(tiny_target):
    """Where decodes are static (a GPU) every stream's padded 30 s window goes through one encoder call, filled to a
    fixed number of rows, with the target's cross-attention keys and values in one product per layer: a window's
    numbers are then the same whatever was encoded with it, and (within the rounding of a batch's products) those it
    gets encoded alone; without ``rows``, one call each."""
    from asr_spec.features import N_FRAMES
    from asr_spec.streaming.encoding import encode_whole, encode_windows

    rec = Recognizer(tiny_target, None)
    audios = [np.random.default_rng(i).normal(0, 0.1, n).astype(np.float32) for i, n in enumerate((16000, 40000, 8000))]
    calls = rec.encoder_calls
    together = encode_windows(rec, audios, rows=4)
    assert rec.encoder_calls == calls + 1
    for audio, encoded in zip(audios, together):
        assert encoded.positions == N_FRAMES // 2 and encoded.draft_memory is None
        alone = encode_windows(rec, [audio], rows=4)[0]
        assert torch.equal(alone.memory, encoded.memory)
        assert all(torch.equal(a, b) for a, b in zip(alone.cross.keys + alone.cross.values,
                                                     encoded.cross.keys + encoded.cross.values))
        torch.testing.assert_close(encoded.memory, encode_whole(rec, audio, full=True).memory, atol=1e-4, rtol=1e-4)
        kv = tiny_target.decoder.cross_kv(encoded.memory)  # the decoder's own (row-exact) way, close
        for a, b in zip(kv.keys + kv.values, encoded.cross.keys + encoded.cross.values):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    calls = rec.encoder_calls
    assert len(encode_windows(rec, audios, rows=None)) == 3 and rec.encoder_calls == calls + 3
