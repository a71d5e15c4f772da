"""Compute types: their resolution per device, int8 layers whose rows do not depend on each other, and exact
speculation at every type (tiny random models; one slow test on the real model at int8)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import DEV, fast_first

from asr_spec.audio import load_audio
from asr_spec.decoding.rows import DecodeOptions, Decoders, RowRequest
from asr_spec.decoding.sampling import Sampler
from asr_spec.decoding.static import run_decode
from asr_spec.features import log_mel, window
from asr_spec.models.compute import ComputeTypeError, int8_kernels, resolve_compute_type, runnable
from asr_spec.models.linear import CUDA_ROWS, Int8, in_blocks, in_slices
from asr_spec.models.loader import ModelOptions, default_draft, load, load_draft, load_target
from asr_spec.models.pair import Pair
from asr_spec.models.sources import ModelError

TYPES = ["float32", "bfloat16", "int8_float32", "int8_bfloat16"]
needs_int8 = pytest.mark.skipif(not int8_kernels("cpu"), reason="no int8 CPU kernels here")


def _cpu(tmp_path, flags: str) -> str:
    f = tmp_path / f"cpuinfo-{abs(hash(flags))}"
    f.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 avx2 {flags}\n")
    return str(f)


@needs_int8
def test_int8_follows_the_cpu_and_auto_is_what_is_measured(tmp_path):
    """int8's float is bfloat16 only where the CPU computes it natively (fake cpuinfo); auto is what the measurement
    says, never a guess from flags."""
    plain, bf16, amx = _cpu(tmp_path, ""), _cpu(tmp_path, "avx512f avx512_bf16"), _cpu(tmp_path, "amx_bf16 amx_tile")
    assert resolve_compute_type("auto", "cpu", plain, auto=lambda: "bfloat16").name == "bfloat16"
    assert resolve_compute_type("auto", "cpu", amx, auto=lambda: "int8").name == "int8_bfloat16"
    with pytest.raises(ComputeTypeError, match="auto is measured"):
        resolve_compute_type("auto", "cpu", bf16)
    assert resolve_compute_type("int8", "cpu", bf16).name == "int8_bfloat16"
    assert resolve_compute_type("int8", "cpu", amx).name == "int8_bfloat16"
    assert resolve_compute_type("int8", "cpu", _cpu(tmp_path, "avx512f avx512bw")).name == "int8_float32"
    assert resolve_compute_type("int8", "cpu", str(tmp_path / "missing")).name == "int8_float32"
    p = resolve_compute_type("int8_bfloat16", "cpu", plain)  # asked for by name: runs (emulated), never chosen
    assert (p.float, p.int8) == (torch.bfloat16, True)
    f = resolve_compute_type("float32", "cpu", bf16)
    assert (f.name, f.float, f.int8) == ("float32", torch.float32, False)


def test_a_type_the_device_cannot_run_is_refused_with_the_types_it_can():
    with pytest.raises(ComputeTypeError, match="float16 cannot run on cpu; it runs auto.*float32, bfloat16"):
        resolve_compute_type("float16", "cpu")
    with pytest.raises(ComputeTypeError, match="unknown compute type 'int4'"):
        resolve_compute_type("int4", "cpu")
    assert "float16" not in runnable("cpu")
    with pytest.raises(ModelError, match="int8_float16 cannot run on cpu"):
        load(ModelOptions(compute_type="int8_float16"))


def test_every_command_that_loads_a_model_takes_a_compute_type(capsys):
    from asr_spec.cli import build_parser, main

    p = build_parser()
    for argv in (["transcribe", "x.wav"], ["serve"], ["mic"], ["eval", "--manifest", "m"], ["distill", "--out", "o"]):
        assert p.parse_args(argv + ["--compute-type", "int8"]).compute_type == "int8"
    from asr_spec.server.settings import from_arguments

    assert from_arguments(p.parse_args(["serve"])).compute_type == "auto" and p.parse_args(["mic"]).compute_type == "auto"
    assert p.parse_args(["transcribe"]).compute_type == "float32"
    assert main(["transcribe", "--sample", "--quiet", "--compute-type", "float16"]) == 1
    assert "compute type float16 cannot run on cpu" in capsys.readouterr().err


def test_float_layers_in_fixed_blocks_give_each_row_the_same_bits_in_any_company():
    """How float layers stay exact on CUDA (``project``: blocks of CUDA_ROWS rows; eval/experiments/exact_linear.py --device cuda
    shows plain products differ there by row count): row 0 alone and among 2..600 rows (several blocks, last block
    partly filled) gives the same bits; the result is the product's."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(384, 64, generator=g)
    x = torch.randn(600, 64, generator=g)
    alone = in_blocks(x[:1], w, CUDA_ROWS)
    for m in (2, 3, 9, 40, CUDA_ROWS, CUDA_ROWS + 1, 600):
        out = in_blocks(x[:m], w, CUDA_ROWS)
        assert out.shape == (m, 384) and torch.equal(out[0], alone[0]), m
        assert torch.equal(out[-1], in_blocks(x[m - 1:m], w, CUDA_ROWS)[0]), m
    assert torch.allclose(in_blocks(x, w, CUDA_ROWS), x @ w.t(), atol=1e-4)


def test_a_layer_in_slices_is_the_product_a_call_per_slice():
    """``in_slices`` (the bfloat16 way where kernels change from ~33 rows on): up to ``size`` rows one call, more a call
    per ``size`` rows; its rows are the product's, and a row's bits are those of the slice it was computed in."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g)
    x = torch.randn(70, 64, generator=g)
    for m in (1, 32, 33, 70):
        out = in_slices(x[:m], w, 32)
        assert out.shape == (m, 96) and torch.allclose(out, x[:m] @ w.t(), atol=1e-4), m
    assert torch.equal(in_slices(x, w, 32)[64:], F.linear(x[64:], w))


def test_a_bfloat16_layer_packed_once_is_the_product(tmp_path, monkeypatch):
    """The bfloat16 way oneDNN packs (its product on a weight reordered once for one-row calls: 1.2 against 2.7 ms
    for whisper-base's output layer on a Xeon with AMX) computes the product at every row count where this CPU runs
    it, and is not chosen where it does not (oneDNN's bfloat16 wants AVX512 or AMX); a :class:`Dense` layer prepares
    its weight once for the way chosen, not at every call."""
    from asr_spec.models import linear

    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g).bfloat16()
    x = torch.randn(70, 64, generator=g).bfloat16()
    way = linear.WAYS[torch.bfloat16][0]
    assert way.prepare is linear.packed
    ref = x.float() @ w.float().t()
    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear, "_CHOSEN", {})
    try:
        packed = way.prepare(w)
        runs = [way.call(x[:m], packed) for m in (1, 2, 4, 33, 70)]
    except RuntimeError:  # this CPU's oneDNN has no bfloat16 products: another way must be the one chosen
        assert linear.exact_way(96, 64, torch.bfloat16, torch.device("cpu")).name != way.name
    else:
        for y, m in zip(runs, (1, 2, 4, 33, 70)):
            assert torch.allclose(y.float(), ref[:m], atol=0.1, rtol=0.02), m
    layer = linear.Dense(w)
    first = layer(x[:3])
    prepared = layer._prepared
    assert prepared[0] == linear.exact_way(96, 64, torch.bfloat16, torch.device("cpu")).name
    assert torch.equal(layer(x[:3]), first) and layer._prepared[1] is prepared[1]
    assert torch.allclose(first.float(), ref[:3], atol=0.1, rtol=0.02)


def test_the_row_exact_way_is_measured_once_per_machine_and_kept_on_disk(tmp_path, monkeypatch):
    """The first process on a machine measures a layer's row-exact way (random rows, up to 2000 of them: ~6 s of
    whisper-base's first load) and keeps it beside the models; later processes read it and measure nothing. A
    way the file names that is not one of this type's ways is measured again."""
    import json

    from asr_spec.models import linear

    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear, "_CHOSEN", {})
    name = linear.exact_way(96, 64, torch.float32, torch.device("cpu")).name
    (kept,) = (tmp_path / "exact-ways").glob("*.json")
    assert torch.__version__.replace("+", "_") in kept.name and name in json.loads(kept.read_text())["ways"].values()
    with monkeypatch.context() as env:  # another oneDNN kernel set: another file
        env.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
        assert linear._ways_file() != kept and "AVX2" in linear._ways_file().name
    monkeypatch.setattr(linear, "_CHOSEN", {})  # a new process
    monkeypatch.setattr(linear, "row_exact", lambda *a, **k: pytest.fail("measured again"))
    assert linear.exact_way(96, 64, torch.float32, torch.device("cpu"))[0] == name
    layer = next(iter(json.loads(kept.read_text())["ways"]))
    kept.write_text(json.dumps({"ways": {layer: "no such way"}}))
    monkeypatch.setattr(linear, "_CHOSEN", {})
    measured = []
    monkeypatch.setattr(linear, "row_exact", lambda *a, **k: measured.append(1) or True)
    assert linear.exact_way(96, 64, torch.float32, torch.device("cpu")).name in [w.name for w in linear.WAYS[torch.float32]]
    assert measured


def test_a_layer_measures_its_way_when_it_is_made_not_at_its_first_call(tmp_path, monkeypatch):
    """A machine's first process measures the ways while its models load (``asr_spec transcribe`` says how long), so
    the first decode's time is a decode's: nothing is measured at the layer's first call."""
    from asr_spec.models import linear

    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear, "_CHOSEN", {})
    monkeypatch.setattr(linear, "_MEASURING_S", [0.0])
    layer = linear.Dense(torch.randn(96, 64))
    assert linear.measuring_seconds() > 0 and list((tmp_path / "exact-ways").glob("*.json"))
    monkeypatch.setattr(linear, "row_exact", lambda *a, **k: pytest.fail("measured at the first call"))
    monkeypatch.setattr(linear, "step_seconds", lambda *a, **k: pytest.fail("timed at the first call"))
    assert layer(torch.randn(3, 64)).shape == (3, 96)


def test_the_ways_are_tried_in_the_order_of_their_speed_here(tmp_path, monkeypatch):
    """The ways' order measured on one CPU need not be another's (oneDNN's packed bfloat16 products are fast with
    AMX): a way listed first but slower here loses to a faster row-exact one."""
    import time

    from asr_spec.models import linear

    def slow(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return in_blocks(x, w, 4)

    ways = [linear.Way("slow", slow), linear.Way("fast", lambda x, w: in_blocks(x, w, 4))]
    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear, "_CHOSEN", {})
    monkeypatch.setitem(linear.WAYS, torch.float32, ways)
    assert linear.step_seconds(ways, linear.probe_weight(96, 64, torch.float32, torch.device("cpu")))[0] > 0.004
    assert linear.exact_way(96, 64, torch.float32, torch.device("cpu")).name == "fast"


def test_ways_within_a_fifth_of_the_fastest_keep_their_listed_order(monkeypatch):
    """Timings drift 10-20 %: a way listed first that is within 20 % of the fastest stays first (the same choice on
    every first run of a machine), one clearly slower goes after the fastest."""
    from asr_spec.models import linear

    ways = [linear.Way(name, lambda x, w: x @ w.t()) for name in ("slow", "listed first", "fastest")]
    monkeypatch.setattr(linear, "step_seconds", lambda ways, weight: [0.010, 0.0022, 0.002])
    weight = linear.probe_weight(96, 64, torch.float32, torch.device("cpu"))
    assert [w.name for w in linear.by_speed(ways, weight)] == ["listed first", "fastest", "slow"]


def test_the_row_exact_probe_sees_one_output_of_one_row_change_in_company():
    """Two kernels that sum in other orders differ in a few outputs in 10,000 (bfloat16; a Xeon with AMX: 3 of a
    row's 51865), so the probe compares every output of 16 rows, alone and first or last among others: a way whose
    rows keep their bits passes, one that moves a single output of one row among others (not row 0) fails. The
    kept file is per oneDNN kernel set (AMX on or off: other kernels)."""
    from asr_spec.models import linear

    cpu = torch.device("cpu")

    def nudged(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x @ w.t()
        if x.shape[0] > 1:
            y[min(5, x.shape[0] - 1), 7] += 1e-3
        return y

    weight = linear.probe_weight(96, 64, torch.float32, cpu)
    assert linear.row_exact(linear.Way("blocks", lambda x, w: in_blocks(x, w, 16)), weight, (2, 9, 33))
    assert not linear.row_exact(linear.Way("nudged", nudged), weight, (2, 9, 33))


@needs_int8
@pytest.mark.parametrize("kernel", ["fbgemm", "int_mm"])
def test_an_int8_target_layer_gives_each_row_the_same_bits_in_any_company(kernel):
    """A row's output must not depend on the rows beside it (the batch, the other verified positions): row 0
    alone, among 1..16 others, last instead of first. The per-call scale of a draft layer fails the same check."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g) * 0.05, torch.randn(96, generator=g)
    x = torch.randn(17, 64, generator=g)
    x[5] *= 40  # a loud row beside it changes a per-call scale
    layer = Int8(w, b, kernel=kernel)
    alone = layer(x[:1])
    for rows, at in ((x[:2], 0), (x[:4], 0), (x[:5], 0), (x[:9], 0), (x, 0), (torch.cat([x[1:6], x[:1]]), 5)):
        assert torch.equal(layer(rows)[at], alone[0])
    ref = x @ w.t() + b
    assert ((layer(x) - ref).abs().max() / ref.abs().max()).item() < 0.03  # quantisation noise only
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    shared = Int8(w, b, rows=False)  # the draft's faster layer: one scale per call
    assert not torch.equal(shared(x[:6])[0], shared(x[:1])[0])


def _memory(batch: int) -> torch.Tensor:
    return torch.randn(batch, 20, 32, generator=torch.Generator().manual_seed(0))


PROMPTS = [[50258, 50259, 50359], [50361, 100, 200, 50258, 50259, 50359], [50258, 50259, 50358]]


def _decode(target, draft, prompts, k, sampler=None, memory=None):
    v = target.vocab
    from asr_spec.decoding.logits import LogitRules

    mem = _memory(len(prompts)) if memory is None else memory
    requests = [RowRequest(p, p.index(v.sot), sample_len=20, key=(i,)) for i, p in enumerate(prompts)]
    o = DecodeOptions(LogitRules.whisper(v, True), v.eot, v.no_speech, sampler or Sampler(), k=k)
    return run_decode(Decoders(target.decoder, draft.decoder if draft else None), Pair(mem, mem), requests, o)


@pytest.fixture(scope="module", params=fast_first(list(TYPES)))
def typed_target(request, tiny_dir):
    if request.param.startswith("int8") and not int8_kernels("cpu"):
        pytest.skip("no int8 CPU kernels here")
    return load_target(str(tiny_dir), compute_type=request.param)




def test_speculation_is_exact_at_every_compute_type(typed_target):
    """Greedy and seeded sampling, K = 1 and 4, a float and an int8 draft: speculative tokens equal the target's
    own at its type; each row decoded inside the batch equals that row decoded alone (batch 3 == batch 1)."""
    mem = _memory(len(PROMPTS))
    ref = _decode(typed_target, None, PROMPTS, 0)
    for i, p in enumerate(PROMPTS):
        assert _decode(typed_target, None, [p], 0, memory=mem[i:i + 1])[0].tokens == ref[i].tokens
    drafts = {int8: load_draft("layers:0", typed_target, int8=int8 and int8_kernels("cpu")) for int8 in (False, True)}
    for k in (1, 4):
        for int8 in (False, True):
            for i, r in enumerate(_decode(typed_target, drafts[int8], PROMPTS, k)):
                assert r.tokens == ref[i].tokens, (typed_target.precision.name, k, int8, i)
    sampler = lambda: Sampler(0.7, seed=3)  # noqa: E731
    alone = _decode(typed_target, None, PROMPTS * 4, 0, sampler(), _memory(12))
    assert len({tuple(r.tokens) for r in alone}) > 3  # really sampling
    spec = _decode(typed_target, drafts[True], PROMPTS * 4, 3, sampler(), _memory(12))  # load_draft's CPU default
    assert [r.tokens for r in spec] == [r.tokens for r in alone]


def test_an_exact_decoder_gives_a_position_the_same_bits_in_any_pass(typed_target):
    """Logits of one position computed in a 1-token step, inside a 4-token verify pass and a 9-token pass, and as
    row 2 of a batch of 3: bitwise equal at every type, float32 included."""
    dec, mem = typed_target.decoder, _memory(3)
    tokens = torch.randint(0, 50000, (3, 20), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(20).expand(3, -1)

    def logits(rows: slice, start: int, width: int) -> torch.Tensor:
        cache = dec.new_cache(mem[rows], 40)
        dec(cache, tokens[rows, :start], pos[rows, :start])
        return dec(cache, tokens[rows, start:start + width], pos[rows, start:start + width])

    one = logits(slice(2, 3), 8, 1)[0, 0]
    others = (logits(slice(2, 3), 8, 4)[0, 0], logits(slice(2, 3), 5, 9)[0, 3], logits(slice(0, 3), 8, 4)[2, 0])
    same = [torch.equal(one, o) for o in others]
    assert dec.exact and all(same), same


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_a_row_decodes_to_the_same_bits_alone_and_in_any_company(typed_target):
    """Batch company never changes a row: a row decoded alone and among 2..8 rows of other prompts and other memory
    lengths (ragged memories: each row attends to its own), first, last or in the middle, target-only and with a
    draft, gives the same tokens and the same sum of log-probabilities to the last bit. What streaming's batches
    (which streams share a step depends on timing) and batch transcription rest on."""
    g = torch.Generator().manual_seed(4)
    lengths = [20, 13, 7, 20, 17, 9, 20, 11]
    memory = torch.randn(8, 20, 32, generator=g)
    prompts = [PROMPTS[i % 3] for i in range(8)]
    draft = load_draft("layers:0", typed_target)
    v = typed_target.vocab
    from asr_spec.decoding.logits import LogitRules

    def decode(rows: list[int], k: int):
        requests = [RowRequest(prompts[r], prompts[r].index(v.sot), sample_len=12, memory_length=lengths[r]) for r in rows]
        o = DecodeOptions(LogitRules.whisper(v, True), v.eot, v.no_speech, k=k)
        mem = memory[rows]
        return [(r.tokens, r.sum_logprob) for r in run_decode(Decoders(typed_target.decoder, draft.decoder),
                                                                      Pair(mem, mem), requests, o)]

    for k in (0, 3):
        alone = {r: decode([r], k)[0] for r in (1, 4, 6)}
        for company in ([4, 1], [0, 1, 2, 3, 4, 5, 6, 7], [6, 3], [2, 6, 5, 1], [7, 6, 5, 4, 3, 2, 1]):
            got = decode(company, k)
            for place, r in enumerate(company):
                if r in alone:
                    assert got[place] == alone[r], (typed_target.precision.name, k, company, r)


def test_each_type_computes_in_its_own_float_and_returns_float32(typed_target, tiny_target):
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(0))
    out, ref = typed_target.encode(mel), tiny_target.encode(mel)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    close = (out - ref).abs().max() / ref.abs().max()
    assert (close == 0) == (typed_target.precision.name == "float32") and close < 0.1
    assert typed_target.decoder.dtype == typed_target.precision.float
    assert next(tiny_target.encoder.parameters()).dtype == torch.float32  # other loads are untouched


@pytest.mark.slow
@needs_int8
def test_int8_speculation_equals_int8_target_on_dev_speech_batch_8_and_1(dev_manifest):
    """The real model at int8: 16 dev utterances decoded as two batches of 8 speculatively, each compared with
    the int8 target alone at batch 1: token for token."""
    from test_exact_real_speech import compare

    from asr_spec.transcribe import TranscribeOptions, Transcriber

    target = load_target("whisper-base", compute_type="int8")
    tr = Transcriber(target, load_draft(default_draft("whisper-base"), target))
    prompt = tr.prompt([], "en", "transcribe", True)
    items, lines, accepted = dev_manifest[::4][:16], [], 0
    for start in range(0, len(items), 8):
        batch = items[start:start + 8]
        memories = tr.encode(torch.stack([window(log_mel(load_audio(DEV / it["audio"])), 0) for it in batch]))
        o = TranscribeOptions()
        spec = tr.decode(memories, [prompt] * len(batch), 0.0, True, k=o.k, draft_stop=o.draft_stop)
        for i, it in enumerate(batch):
            mem_i = Pair(memories.target[i:i + 1], memories.draft[i:i + 1])
            ref = tr.decode(mem_i, [prompt], 0.0, True, k=0, use_draft=False)[0]
            lines += compare(tr, mem_i.target, prompt.prompt, ref.tokens, spec[i].tokens, True, it["id"])
            accepted += spec[i].stats.accepted
    print(f"{len(items)} utterances at {target.precision.name}: {len(lines)} divergences")
    assert accepted > 0


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_auto_measures_each_native_type_once_and_keeps_the_fastest(tiny_dir, tmp_path, monkeypatch, capsys):
    """auto on first use times every type the CPU computes natively (the tiny model: an encoder window and passes of
    K draft steps and a verify), says what it chose and why, keeps it in the cache directory, and from then on reads
    it back without measuring; a measurement that names another type is what the next load uses, and one kept by
    another revision of the code is taken again."""
    import json

    from asr_spec.models import auto

    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    options = ModelOptions(str(tiny_dir), None, "cpu", "auto")
    chosen = options.precision().name
    err = capsys.readouterr().err
    kept = json.loads(next((tmp_path / "auto").glob("*.json")).read_text())
    assert kept["candidates"] == auto.native_types("cpu") and chosen == kept["chosen"] in kept["seconds"]
    assert chosen == min(kept["seconds"], key=kept["seconds"].get)
    assert "compute type auto = " + chosen in err and "seconds per window" in err
    monkeypatch.setattr(auto, "window_seconds", lambda *a, **k: pytest.fail("measured again"))
    assert options.precision().name == chosen and "measuring" not in capsys.readouterr().err
    path = next((tmp_path / "auto").glob("*.json"))
    other = next(t for t in kept["candidates"] if t != chosen)
    path.write_text(json.dumps(kept | {"chosen": other}))
    target = load_target(str(tiny_dir), compute_type="auto")
    assert target.precision.name == other and target.name.endswith(f"({other}, auto)")
    path.write_text(json.dumps(kept | {"revision": auto.REVISION - 1}))  # kept by code whose costs were others
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        options.precision()


def test_auto_skips_a_type_whose_kernels_refuse_to_run_and_says_so(tmp_path, capsys):
    """A type the device lists as native but whose kernels refuse the model's shapes (cuBLAS's int8 matmul on the
    tiny model's width 32, seen on an H100) is left out of auto's choice with its reason, not a crash; when no type
    runs, auto says so."""
    import json

    from asr_spec.models import auto

    def measure(c: str) -> float:
        if c.startswith("int8"):
            raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul")
        return {"float16": 0.2, "bfloat16": 0.1}[c]

    chosen = auto.measured_type("gpu", ["float16", "bfloat16", "int8_float16"], measure, tmp_path)
    kept = json.loads(next((tmp_path / "auto").glob("*.json")).read_text())
    assert chosen == "bfloat16" and "CUBLAS_STATUS_NOT_SUPPORTED" in kept["failed"]["int8_float16"]
    assert "int8_float16 does not run here" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="no type runs here"):
        auto.measured_type("none", ["int8_float16"], measure, tmp_path)
