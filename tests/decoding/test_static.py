"""The static decode (decoding/static.py) on the CPU: the passes a CUDA graph replays, run eagerly. Slots are claimed,
freed and compacted in place; every row gets the eager loop's tokens and log-probabilities to the last bit, in any
company and bucket; batch 8 == batch 1; an arena outlives its decode and grows when a bigger batch comes."""
from __future__ import annotations

import pytest
import torch
from conftest import fast_first

from asr_spec.decoding import static
from asr_spec.decoding.logits import LogitRules
from asr_spec.decoding.rows import DecodeOptions, Decoders, RowRequest
from asr_spec.decoding.sampling import Sampler
from asr_spec.decoding.speculative import DecodingTask, decode_capacity
from asr_spec.decoding.static import StaticDecodingTask, bucket, eligible, run_decode
from asr_spec.models.loader import load_draft
from asr_spec.models.pair import Pair

PROMPTS = [[50258, 50259, 50359], [50361, 100, 200, 50258, 50259, 50359], [50258, 50259, 50358],
           [50258, 50259, 50359, 50363]]
LENGTHS = [12, 30, 5, 20, 9, 16, 3, 25]  # sample_len per row: rows finish at different passes


@pytest.fixture(scope="module")
def draft(tiny_target):
    return load_draft("layers:0", tiny_target)


def _requests(v, rows: list[int], draft_memory: bool = False) -> list[RowRequest]:
    return [RowRequest(PROMPTS[r % 4], PROMPTS[r % 4].index(v.sot), sample_len=LENGTHS[r],
                       draft_memory_length=(7 + r) if draft_memory else None) for r in rows]


def _options(v, k: int, timestamps: bool = True) -> DecodeOptions:
    return DecodeOptions(LogitRules.whisper(v, timestamps), v.eot, v.no_speech, k=k, static=True)


def _memory() -> torch.Tensor:
    return torch.randn(8, 20, 32, generator=torch.Generator().manual_seed(5))


@torch.inference_mode()
def _run(task_type, target, draft, rows, k, timestamps=True, draft_memory=False):
    v = target.vocab
    mem = _memory()[rows]
    task = task_type(Decoders(target.decoder, draft.decoder), Pair(mem, mem), _requests(v, rows, draft_memory),
                     _options(v, k, timestamps))
    return [(r.tokens, r.sum_logprob, r.no_speech_prob, r.stats.target_passes) for r in task.run()], task


def eager(target, draft, rows, k, **kw):
    v = target.vocab
    mem = _memory()[rows]
    return [(r.tokens, r.sum_logprob, r.no_speech_prob, r.stats.target_passes) for r in
            DecodingTask(Decoders(target.decoder, draft.decoder), Pair(mem, mem),
                         _requests(v, rows, kw.get("draft_memory", False)), _options(v, k, kw.get("timestamps", True))).run()]


@pytest.mark.parametrize("k", fast_first([3, 0, 1]))
def test_a_static_decode_gives_every_row_the_eager_loops_bits(tiny_target, draft, k):
    """8 rows of other prompts and lengths, rows leaving at different passes (compaction, buckets 8 -> 4 -> 2 -> 1):
    tokens, sum of log-probabilities and no-speech probability equal the eager loop's, with and without timestamps,
    with each row's draft reading its own share of the memory."""
    rows = list(range(8))
    for timestamps, draft_memory in ((True, False), (False, True)):
        got, task = _run(StaticDecodingTask, tiny_target, draft, rows, k, timestamps, draft_memory)
        want = eager(tiny_target, draft, rows, k, timestamps=timestamps, draft_memory=draft_memory)
        assert [g[:3] for g in got] == [w[:3] for w in want], (k, timestamps)
        assert len({len(g[0]) for g in got}) > 3  # rows really left at different passes
    if k:  # speculation at work: fewer passes than tokens
        assert sum(g[3] for g in got) < sum(len(g[0]) for g in got)


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_batch_8_equals_batch_1_and_the_arena_is_reused_and_grows(tiny_target, draft):
    """Each row alone (an arena of one slot) and inside batches of 2..8 in any order: the same bits. Decodes of one
    shape reuse their arena; a bigger batch gets a bigger one."""
    static.forget_arenas()
    alone = {r: _run(StaticDecodingTask, tiny_target, draft, [r], 3)[0][0] for r in range(8)}
    first = next(iter(static.arenas(tiny_target.decoder).values()))
    assert first.size == 1
    _run(StaticDecodingTask, tiny_target, draft, [5], 3)
    assert next(iter(static.arenas(tiny_target.decoder).values())) is first  # reused
    largest, arenas = 1, {first.size: first}
    for company in ([7, 2], [0, 1, 2, 3, 4, 5, 6, 7], [6, 3, 1], [7, 6, 5, 4, 3, 2, 1]):
        got, task = _run(StaticDecodingTask, tiny_target, draft, company, 3)
        largest = max(largest, len(company))
        # grown to the bucket of the largest batch so far (2, then 8), then reused for the smaller ones
        assert task.arena.size == bucket(largest), (company, task.arena.size)
        assert arenas.setdefault(task.arena.size, task.arena) is task.arena, company
        for place, r in enumerate(company):
            assert got[place][:3] == alone[r][:3], (company, r)


@torch.inference_mode()
def test_slots_are_claimed_freed_and_compacted_in_place(tiny_target, draft):
    """A decode's rows hold the first slots; when rows finish the last rows move into their slots, at the same
    addresses; a pass over m rows runs its bucket."""
    v = tiny_target.vocab
    mem = _memory()
    task = StaticDecodingTask(Decoders(tiny_target.decoder, draft.decoder), Pair(mem, mem), _requests(v, range(8)),
                              _options(v, 3))
    a = task.arena
    s = a.slots
    addresses = [t.data_ptr() for t in s.tensors()]
    assert a.size == 8 and task.slots is s and torch.equal(s.seq[:8, :3], torch.tensor([p[:3] for p in
                                                                                       (PROMPTS * 2)]))
    task.prefill()
    marker = s.target.self_k[0][5].clone()
    task.finish([(1, False), (3, False), (4, False)])  # slots 1, 3, 4 free: 5, 6, 7 move into them
    assert [r.index for r in task.live] == [0, 5, 2, 6, 7] and task.view().seq.shape[0] == 5
    assert torch.equal(s.target.self_k[0][1], marker)  # slot 5's cache now in slot 1
    assert [t.data_ptr() for t in s.tensors()] == addresses  # compacted in place
    idle = s.n[5:].clone(), s.seq[:5].clone()
    read = a.run_pass(5)  # bucket 8: slots 5..7 idle
    assert len(read) == 5 and all(row[1] >= 1 for row in read)  # every live row took a token
    assert torch.equal(s.n[5:], idle[0]) and not torch.equal(s.seq[:5], idle[1])  # idle slots do not move
    assert [bucket(m) for m in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]


def test_what_the_static_path_takes(tiny_target, draft, monkeypatch):
    """Asked to, greedy, no recorded heads, ASR_SPEC_STATIC not off (hints and padded memories too:
    test_static_streams.py); the dispatcher gives the others to the eager loop, with the same results."""
    v = tiny_target.vocab
    mem = _memory()[:2]
    d = Decoders(tiny_target.decoder, draft.decoder)
    plain = _requests(v, [0, 1])
    monkeypatch.setenv("ASR_SPEC_STATIC", "on")
    assert eligible(d, Pair(mem, mem), plain, _options(v, 3))
    from dataclasses import replace

    assert eligible(d, Pair(mem, mem), [replace(plain[0], hint=[1, 2])], _options(v, 3))  # streams: tests below
    assert eligible(d, Pair(mem, mem), [replace(plain[0], memory_length=9)], _options(v, 3))
    assert not eligible(d, Pair(mem, mem), plain, replace(_options(v, 3), sampler=Sampler(0.5)))
    assert not eligible(d, Pair(mem, mem), plain, replace(_options(v, 3), attention_heads=((0, 0),)))
    assert not eligible(d, Pair(mem, mem), plain, replace(_options(v, 3), static=False))  # not asked (streams)
    on = [r.tokens for r in run_decode(d, Pair(mem, mem), plain, _options(v, 3))]
    arena = static.arena_for(d, 3, _options(v, 3), 2, Pair(mem, mem),
                             decode_capacity(tiny_target.decoder.max_positions, 3), False)  # run_decode's
    with arena.lock:  # another thread's decode holds the arena: this one runs eagerly, the arena untouched
        before = arena.slots.seq.clone()
        assert [r.tokens for r in run_decode(d, Pair(mem, mem), plain, _options(v, 3))] == on
        assert torch.equal(arena.slots.seq, before)
    monkeypatch.setenv("ASR_SPEC_STATIC", "off")
    assert not eligible(d, Pair(mem, mem), plain, _options(v, 3))
    assert [r.tokens for r in run_decode(d, Pair(mem, mem), plain, _options(v, 3))] == on
    monkeypatch.setenv("ASR_SPEC_STATIC", "auto")
    assert not eligible(d, Pair(mem, mem), plain, _options(v, 3))  # auto: CUDA only
    monkeypatch.setenv("ASR_SPEC_STATIC", "maybe")
    with pytest.raises(ValueError, match="ASR_SPEC_STATIC"):
        eligible(d, Pair(mem, mem), plain, _options(v, 3))


def test_an_earlier_decodes_idle_slots_never_break_a_later_one(tiny_target, draft):
    """Slots left by a decode of long prompts (their no-speech read far in, their lengths long) idle in a later
    decode of short ones whose bucket covers them: its rows still get the eager loop's bits."""
    v = tiny_target.vocab
    static.forget_arenas()
    long_prompt = [50361] + list(range(100, 140)) + [50258, 50259, 50359]
    mem = _memory()
    d = Decoders(tiny_target.decoder, draft.decoder)
    first = [RowRequest(long_prompt, long_prompt.index(v.sot), sample_len=30) for _ in range(4)]
    with torch.inference_mode():
        StaticDecodingTask(d, Pair(mem[:4], mem[:4]), first, _options(v, 3)).run()
        got, _ = _run(StaticDecodingTask, tiny_target, draft, [0, 1, 2], 3)  # bucket 4: slot 3 idle
    assert [g[:3] for g in got] == [w[:3] for w in eager(tiny_target, draft, [0, 1, 2], 3)]
