"""A stream engine's decodes on the static path (decoding/static.py) on the CPU: buffers of other lengths padded to
one width and attended under their masks, hints proposed in the draft's place. Every row gets the same bits in the
arena as in the eager loop and in any company; speculative == target-only; a hint is used and never changes the
text."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from asr_spec.decoding import static
from asr_spec.decoding.budget import Tally
from asr_spec.decoding.logits import LogitRules
from asr_spec.decoding.rows import DecodeOptions, Decoders, RowRequest
from asr_spec.decoding.speculative import DecodingTask
from asr_spec.decoding.static import StaticDecodingTask
from asr_spec.models.loader import load_draft
from asr_spec.models.pair import Pair

PROMPT = [50258, 50259, 50359]
LENGTHS = [20, 13, 7, 17, 4, 20, 11, 9]  # each stream's buffer, in encoder positions (the width: 20)
SAMPLE = [12, 30, 5, 20, 9, 16, 3, 25]


@pytest.fixture(scope="module")
def draft(tiny_target):
    return load_draft("layers:0", tiny_target)


def _memory() -> torch.Tensor:
    """8 buffers padded to 20 positions (zeros after each one's length, as the engine pads them)."""
    mem = torch.randn(8, 20, 32, generator=torch.Generator().manual_seed(7))
    for i, n in enumerate(LENGTHS):
        mem[i, n:] = 0
    return mem


def _requests(rows: list[int], hints: dict[int, list[int]] | None = None) -> list[RowRequest]:
    return [RowRequest(PROMPT, 0, sample_len=SAMPLE[r], memory_length=LENGTHS[r], hint=(hints or {}).get(r, []))
            for r in rows]


@torch.inference_mode()
def _decode(task_type, target, draft, rows, k, hints=None):
    v = target.vocab
    mem = _memory()[rows]
    o = DecodeOptions(LogitRules.whisper(v, True), v.eot, v.no_speech, k=k, static=True)
    task = task_type(Decoders(target.decoder, draft.decoder), Pair(mem, mem), _requests(rows, hints), o)
    return task.run()


def _bits(results):
    return [(r.tokens, r.sum_logprob, r.no_speech_prob) for r in results]


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
@pytest.mark.parametrize("k", [0, 3])
def test_padded_rows_get_the_same_bits_static_and_eager_alone_and_in_company(tiny_target, draft, k):
    """8 streams of other buffer lengths: the arena's bits are the eager loop's (a padded decode attends as the arena
    does), and each row's are its bits alone (a batch of one, the same width)."""
    static.forget_arenas()
    rows = list(range(8))
    arena = _bits(_decode(StaticDecodingTask, tiny_target, draft, rows, k))
    assert arena == _bits(_decode(DecodingTask, tiny_target, draft, rows, k))
    for r in (0, 2, 4, 7):
        assert _bits(_decode(StaticDecodingTask, tiny_target, draft, [r], k))[0] == arena[r], r
        assert _bits(_decode(DecodingTask, tiny_target, draft, [r], k))[0] == arena[r], r
    assert len({len(t) for t, _, _ in arena}) > 3  # rows really left at different passes


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_speculative_equals_target_only_and_hints_are_used_without_changing_the_text(tiny_target, draft):
    """Static and padded: the draft's proposals (K = 3) give the target's own tokens (K = 0); rows whose hint is
    their last text, half of it, or wrong get the same tokens, and a right hint is accepted (fewer passes)."""
    static.forget_arenas()
    rows = list(range(8))
    plain = _decode(StaticDecodingTask, tiny_target, draft, rows, 3)
    assert [r.tokens for r in plain] == [r.tokens for r in _decode(StaticDecodingTask, tiny_target, draft, rows, 0)]
    hints = {0: plain[0].tokens, 1: plain[1].tokens[:len(plain[1].tokens) // 2], 3: [7, 8, 9], 5: plain[5].tokens}
    hinted = _decode(StaticDecodingTask, tiny_target, draft, rows, 3, hints)
    assert _bits(hinted) == _bits(plain)
    assert _bits(hinted) == _bits(_decode(DecodingTask, tiny_target, draft, rows, 3, hints))
    for r in (0, 5):
        st = hinted[r].stats  # every proposal accepted but where the text ends: K + 1 tokens a pass
        assert st.hint_accepted >= 3 * (st.target_passes - 1) and st.target_passes <= -(-len(plain[r].tokens) // 4), r
    assert hinted[3].stats.hint_accepted == 0


def test_a_padded_decode_takes_the_arena_and_keeps_each_rows_own_cross_attention(tiny_target, draft, monkeypatch):
    """``open_decode`` gives a stream's rows (memory lengths, hints) to the arena when the device wants it; a result's
    kept cross-attention is its own buffer's length (what its words are aligned over)."""
    monkeypatch.setenv("ASR_SPEC_STATIC", "on")
    v = tiny_target.vocab
    mem = _memory()[:3]
    o = DecodeOptions(LogitRules.whisper(v, True), v.eot, v.no_speech, k=3, static=True, keep_cross=True)
    task = static.open_decode(Decoders(tiny_target.decoder, draft.decoder), Pair(mem, mem),
                              _requests([0, 1, 2], {1: [5, 6]}), o)
    try:
        assert isinstance(task, StaticDecodingTask)
        results = task.run()
    finally:
        task.close()
    assert [r.cross.keys[0].shape[2] for r in results] == LENGTHS[:3]
    eager = _decode(DecodingTask, tiny_target, draft, [0, 1, 2], 3, {1: [5, 6]})
    assert _bits(results) == _bits(eager)
    unpadded = replace(o, static=False)  # the eager loop's own way (each length on its own): not asked to pad
    with torch.inference_mode():
        plain = DecodingTask(Decoders(tiny_target.decoder, draft.decoder), Pair(mem, mem), _requests([0, 1, 2]),
                             unpadded).run()
    assert [r.tokens for r in plain] == [r.tokens for r in results]


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
@pytest.mark.parametrize("window", ["stream", "full"])
def test_a_stream_through_the_engine_is_exact_on_the_static_path(tiny_target, draft, monkeypatch, window):
    """ASR_SPEC_STATIC=on (what CUDA does by default): a stream's events are the same with a draft and without, and
    the same when every decode runs eagerly (an arena busy: the eager loop attends the padded buffers as the arena
    does); the engine's decodes really ran in arenas. With the streaming encoder and with full windows (CUDA's
    default: every stream's window in one call, the keys and values it gives the decodes)."""
    from asr_spec.recognizer import Recognizer
    from asr_spec.streaming.config import EngineConfig, StreamConfig
    from asr_spec.streaming.engine import Engine, stream_audio

    monkeypatch.setenv("ASR_SPEC_STATIC", "on")
    audio = torch.randn(48000, generator=torch.Generator().manual_seed(3)).mul(0.1).numpy()

    def events(use_draft: bool) -> list[tuple]:
        engine = Engine(Recognizer(tiny_target, draft if use_draft else None),
                        EngineConfig(max_step_s=0.0, encoder_window=window, draft=use_draft))
        return [(e.type, e.text, round(e.start, 3), round(e.end, 3)) for e in
                stream_audio(engine, audio, StreamConfig(vad=False), chunk_s=0.3)]

    with Tally() as tally:
        speculative = events(True)
    assert tally[static.RUN] >= 10  # passes and prefills run in arenas
    assert speculative == events(False)
    monkeypatch.setattr(static, "eligible", lambda *a: False)
    with Tally() as tally:
        assert events(True) == speculative
    assert tally[static.RUN] == 0 and tally[static.EAGER] > 0
