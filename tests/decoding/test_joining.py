"""Rows joining a running decode between passes (decoding/joining.py, continuous batching): a row that joins gets the
bits it gets decoded alone — tokens, log-probabilities, no-speech probability, kept cross-attention — in the eager
loop (ragged memories, adaptive draft lengths) and in a static decode's arena (free slots taken after the live rows);
the transcriber's next windows join while other rows are still running, with the text of one file at a time."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from asr_spec.decoding import static
from asr_spec.decoding.costs import BatchCosts
from asr_spec.decoding.logits import LogitRules
from asr_spec.decoding.rows import DecodeOptions, Decoders, RowRequest
from asr_spec.decoding.speculative import DecodingTask
from asr_spec.decoding.static import StaticDecodingTask, open_decode, run_decode
from asr_spec.models.loader import load_draft
from asr_spec.models.pair import Pair
from asr_spec.recognizer import Checks
from asr_spec.transcribe import TranscribeOptions, Transcriber

PROMPTS = [[50258, 50259, 50359], [50361, 100, 200, 50258, 50259, 50359], [50258, 50259, 50358],
           [50258, 50259, 50359, 50363]]
LENGTHS = [12, 30, 5, 20, 9, 16, 3, 25]  # sample_len per row: rows finish at different passes
# rows 0 and 1 start the decode; then, every other pass (or when nothing is live), the next group joins
GROUPS = [[2, 3, 4], [5], [6, 7]]


@pytest.fixture(scope="module")
def draft(tiny_target):
    return load_draft("layers:0", tiny_target)


def _memory(r: int, short: bool) -> torch.Tensor:
    """Row r's encoder output [1, S, 32]: 20 positions, or 14 for rows 0, 1 and 5 where memories are ragged (the
    decode starts with shorter memories than rows that join it, and shorter ones join later)."""
    mem = torch.randn(8, 20, 32, generator=torch.Generator().manual_seed(5))[r:r + 1]
    return mem[:, :14] if short and r in (0, 1, 5) else mem


def _batch(rows: list[int], short: bool) -> Pair[torch.Tensor]:
    mems = [_memory(r, short) for r in rows]
    assert len({m.shape[1] for m in mems}) == 1  # a group joins with one memory length
    return Pair(torch.cat(mems), torch.cat(mems))


def _requests(v, rows: list[int]) -> list[RowRequest]:
    return [RowRequest(PROMPTS[r % 4], PROMPTS[r % 4].index(v.sot), sample_len=LENGTHS[r],
                       draft_memory_length=7 + r) for r in rows]


def _row(result) -> tuple:
    cross = None if result.cross is None else [t.clone() for t in (*result.cross.keys, *result.cross.values)]
    return result.tokens, result.sum_logprob, result.no_speech_prob, cross


def _same(got: tuple, want: tuple) -> bool:
    if got[:3] != want[:3]:
        return False
    return (got[3] is None) == (want[3] is None) and (got[3] is None or all(
        torch.equal(a, b) for a, b in zip(got[3], want[3])))


def _joined(task: DecodingTask, v, short: bool) -> tuple[dict[int, tuple], int]:
    """Drive ``task`` (rows 0 and 1) pass by pass, the GROUPS joining; each row's result and the most rows live."""
    ids = {0: 0, 1: 1}
    got, pending, passes, most = {}, list(GROUPS), 0, 0
    task.start()
    while task.live or pending:
        task.step()
        passes += 1
        for r, result in task.collect():
            got[ids[r]] = _row(result)
        if pending and (passes % 2 == 0 or not task.live):
            rows = pending.pop(0)
            assert task.can_join(_batch(rows, short), _requests(v, rows))
            for row, r in zip(rows, task.join(_batch(rows, short), _requests(v, rows))):
                ids[r] = row
        most = max(most, len(task.live))
    task.close()
    for r, result in task.collect():
        got[ids[r]] = _row(result)
    return got, most


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("kind", ["eager", "eager-ragged-adaptive", "static"])
def test_a_row_that_joins_gets_the_bits_it_gets_alone(tiny_target, draft, monkeypatch, kind, k):
    v = tiny_target.vocab
    short, adaptive = kind == "eager-ragged-adaptive", kind == "eager-ragged-adaptive"
    o = DecodeOptions(LogitRules.whisper(v, True), v.eot, v.no_speech, k=k, static=kind == "static",
                      keep_cross=kind != "static")
    decoders = Decoders(tiny_target.decoder, draft.decoder, BatchCosts() if adaptive else None)
    alone = {r: _row(run_decode(decoders, _batch([r], short), _requests(v, [r]), o)[0]) for r in range(8)}
    monkeypatch.setenv("ASR_SPEC_STATIC", "on" if kind == "static" else "off")
    task = open_decode(decoders, _batch([0, 1], short), _requests(v, [0, 1]), o, room=8)
    assert isinstance(task, StaticDecodingTask) == (kind == "static")
    got, most = _joined(task, v, short)
    assert sorted(got) == list(range(8))
    for r in range(8):
        assert _same(got[r], alone[r]), (kind, k, r)
    assert most >= 4  # rows joined while others ran
    assert len({len(g[0]) for g in got.values()}) > 3  # rows left at different passes


def test_a_static_decode_takes_rows_only_into_free_slots_of_its_shape(tiny_target, draft, monkeypatch):
    """The arena's slots bound what may join (room for 4: 2 live + 3 do not fit), and so do its memory shapes; the
    arena is free for other decodes once the decode is closed."""
    v = tiny_target.vocab
    monkeypatch.setenv("ASR_SPEC_STATIC", "on")
    static.forget_arenas()
    o = DecodeOptions(LogitRules.whisper(v, True), v.eot, v.no_speech, k=3, static=True)
    decoders = Decoders(tiny_target.decoder, draft.decoder)
    task = open_decode(decoders, _batch([0, 1], False), _requests(v, [0, 1]), o, room=4)
    assert isinstance(task, StaticDecodingTask) and task.arena.size == 4 and task.arena.lock.locked()
    task.start()
    assert task.can_join(_batch([2, 3], False), _requests(v, [2, 3]))
    assert not task.can_join(_batch([2, 3, 4], False), _requests(v, [2, 3, 4]))
    assert not task.can_join(_batch([5], True), _requests(v, [5]))  # 14 memory positions: not this arena's 20
    task.close()
    assert not task.arena.lock.locked()


def _noise(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32)


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_the_transcribers_windows_join_a_running_decode(short_target, monkeypatch):
    """Files of 1-3 windows at batch 3: windows join the decode between passes while other rows still run (counted
    by watching ``join``), every file's text is the text it gets alone, and ``before_step`` runs about once per
    window of each file in flight, not before every pass."""
    tr = Transcriber(short_target, load_draft("layers:0,1", short_target))
    audios = {"a": _noise(2, 0), "b": _noise(64, 1), "c": _noise(6, 2), "d": _noise(34, 3), "e": _noise(4, 4)}
    o = TranscribeOptions(language="en", checks=Checks(temperatures=(0.0,)))
    alone = {name: tr.transcribe(a, o) for name, a in audios.items()}
    joins: list[int] = []
    join = DecodingTask.join

    def watched(self, memories, requests):
        joins.append(len(self.live))  # rows still running when these join
        return join(self, memories, requests)

    monkeypatch.setattr(DecodingTask, "join", watched)
    waits: list[int] = []  # the server's hold for live streams: about once per window of each file in flight
    passes = tr.decoder_passes
    got = dict(tr.transcribe_many([(name, lambda a=a: a) for name, a in audios.items()], o, batch_size=3,
                                  before_step=lambda: waits.append(tr.decoder_passes)))
    windows = sum(t.stats.windows + t.stats.fallbacks for t in got.values())
    assert 2 <= len(waits) <= windows and len(waits) < tr.decoder_passes - passes  # not before every pass
    assert sorted(got) == sorted(audios)
    for name, t in got.items():
        assert [s.tokens for s in t.segments] == [s.tokens for s in alone[name].segments], name
    assert alone["b"].stats.windows >= 3
    assert joins and max(joins) > 0  # a window took a finished row's place while the others ran on
