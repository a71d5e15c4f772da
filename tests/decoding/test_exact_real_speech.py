"""Exactness on real speech with the real embedded whisper-base (converted from its PyPI packages)."""
from __future__ import annotations

import json

import jiwer
import pytest
import torch
from conftest import DEV
from whisper_normalizer.english import EnglishTextNormalizer

from asr_spec.audio import load_audio
from asr_spec.decoding.logits import LogitRules
from asr_spec.features import log_mel, window
from asr_spec.models.loader import default_draft, load_draft
from asr_spec.models.pair import Pair
from asr_spec.transcribe import TranscribeOptions, Transcriber

pytestmark = pytest.mark.slow
# the shipped distilled draft (reduced head): long accepted runs, bonus tokens and rejections
GOOD_DRAFT = default_draft("whisper-base") or "layers:0,1,2,3,5"
normalize = EnglishTextNormalizer()


def top2_gap(tr: Transcriber, memory: torch.Tensor, prompt: list[int], sampled: list[int], timestamps: bool) -> float:
    """Relative gap between the target's two best processed logits after prompt + sampled."""
    dec = tr.target.decoder
    seq = torch.tensor([prompt + sampled])
    logits = dec(dec.new_cache(memory, seq.shape[1] + 1), seq, torch.arange(seq.shape[1])[None])[:, -1].float().clone()
    logits = LogitRules.whisper(tr.vocab, timestamps)(logits, [sampled])
    top = logits[0].topk(2).values
    return float((top[0] - top[1]) / top[0].abs().clamp(min=1e-9))


def compare(tr, memory, prompt, ref, spec, timestamps, where) -> list[str]:
    """Empty when identical; a divergence fails, reporting where and the target's top-2 gap there (every type is exact
    per row now, float32 included: a near-tie is no excuse)."""
    if ref == spec:
        return []
    d = next(i for i, (a, b) in enumerate(zip(ref + [-1], spec + [-2])) if a != b)
    gap = top2_gap(tr, memory, prompt, ref[:d], timestamps)
    pytest.fail(f"{where}: diverges at token {d} (target {ref[d:d + 1]}, speculative {spec[d:d + 1]}), top-2 gap {gap:.2e}")


@pytest.fixture(scope="module")
def transcriber(base_model) -> Transcriber:
    """The embedded whisper-base with the shipped draft."""
    return Transcriber(base_model, load_draft(GOOD_DRAFT, base_model))


@pytest.fixture(scope="module")
def dev_memories(transcriber, dev_manifest) -> dict[str, Pair]:
    """Each dev utterance's encoder outputs (target's and draft's), encoded 8 at a time once for both modes (the
    encoder is shared: speculative and target-only decoding read the same memory)."""
    out = {}
    for start in range(0, len(dev_manifest), 8):
        batch = dev_manifest[start:start + 8]
        memories = transcriber.encode(torch.stack([window(log_mel(load_audio(DEV / it["audio"])), 0) for it in batch]))
        out |= {it["id"]: Pair(memories.target[i:i + 1], memories.draft[i:i + 1]) for i, it in enumerate(batch)}
    return out


@pytest.mark.parametrize("timestamps", [True, False])
def test_greedy_speculative_equals_target_on_every_dev_utterance(transcriber, dev_memories, dev_manifest, timestamps):
    tr = transcriber
    prompt = tr.prompt([], "en", "transcribe", timestamps)
    items = dev_manifest if timestamps else dev_manifest[::4]  # the second mode on a quarter of the set
    divergences, drafted, accepted, passes, tokens = [], 0, 0, 0, 0
    for start in range(0, len(items), 8):
        batch = items[start:start + 8]
        mems = [dev_memories[it["id"]] for it in batch]
        memories = Pair(torch.cat([m.target for m in mems]), torch.cat([m.draft for m in mems]))
        o = TranscribeOptions()  # the default K and draft stop
        spec = tr.decode(memories, [prompt] * len(batch), 0.0, timestamps, k=o.k, draft_stop=o.draft_stop)
        for i, it in enumerate(batch):
            mem_i = mems[i]
            ref = tr.decode(mem_i, [prompt], 0.0, timestamps, k=0, use_draft=False)[0]  # target alone
            divergences += compare(tr, mem_i.target, prompt.prompt, ref.tokens, spec[i].tokens, timestamps, it["id"])
            s = spec[i].stats
            drafted, accepted, passes, tokens = drafted + s.drafted, accepted + s.accepted, passes + s.target_passes, tokens + len(spec[i].tokens)
    print(f"{len(items)} utterances, {len(divergences)} divergences; acceptance {accepted / drafted:.2f}, "
          f"{(tokens + 1) / passes:.2f} tokens per target pass")
    assert accepted > 0 and passes < tokens  # the draft really drafted


def test_long_form_speculative_equals_target_with_sane_segments(transcriber):
    meta = json.loads((DEV / "longform" / "manifest.jsonl").read_text().splitlines()[0])
    audio = load_audio(DEV / "longform" / meta["audio"])
    tr = transcriber
    opts = TranscribeOptions(language="en")
    ref = tr.transcribe(audio, opts, use_draft=False)
    spec = tr.transcribe(audio, opts)
    assert [s.tokens for s in spec.segments] == [s.tokens for s in ref.segments]
    assert spec.stats.windows >= 8 and spec.stats.decode.accepted > 0
    starts = [s.start for s in spec.segments]
    assert starts == sorted(starts) and all(s.end >= s.start for s in spec.segments)
    assert spec.segments[-1].end <= len(audio) / 16000 + 1.0
    assert spec.segments[-1].end > len(audio) / 16000 - 30  # reached the last window
    wer = jiwer.wer(normalize(meta["text"]), normalize(spec.text))
    print(f"long-form WER {wer:.3f}, {len(spec.segments)} segments, {spec.stats.windows} windows")
    assert wer < 0.1


def test_converted_weights_transcribe_real_speech(base_model):
    audio = load_audio(DEV / "jfk-inaugural-1961-ask-not.wav")
    t = Transcriber(base_model).transcribe(audio)
    assert t.language == "en"  # detected
    assert "ask not what your country can do for you" in t.text.lower()


def test_hotwords_fix_a_misheard_name(base_transcriber):
    """faster-whisper's hotwords: whisper-base mishears the city in this LJ Speech sentence ("Lubach" at float32,
    "Lubek" at int8); with it among the hotwords it writes "Lübeck", and speculative output still equals
    target-only decoding."""
    audio = load_audio(DEV / "LJ001-0028.wav")
    plain = base_transcriber.transcribe(audio, TranscribeOptions(language="en")).text
    assert "Lübeck" not in plain and "Paris" in plain
    options = TranscribeOptions(language="en", hotwords="Lübeck, Strasbourg, Basel")
    hot = base_transcriber.transcribe(audio, options).text
    assert "Lübeck" in hot
    target_only = Transcriber(base_transcriber.target).transcribe(audio, options).text
    assert hot == target_only
