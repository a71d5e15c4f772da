"""Our plain-torch Whisper (models/network.py) against transformers': directories read and written both ways, the
decoder's training forward, the mel filters and language names it replaced — and a transcription that never imports
transformers (its import cost ~4 s of a process's start)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from benchkit.tiny import save_tiny

from asr_spec.models.network import Config, Network, load_network, save_network


def test_a_directory_we_write_loads_in_transformers_with_the_same_weights(tiny_dir, tmp_path):
    from transformers import WhisperForConditionalGeneration

    ours = load_network(tiny_dir)
    save_network(ours.config, ours.state_dict(), tmp_path / "copy")
    theirs = WhisperForConditionalGeneration.from_pretrained(tmp_path / "copy").eval()
    mine = ours.state_dict()
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(tensor, mine[name]), name
    assert theirs.proj_out.weight.data_ptr() == theirs.model.decoder.embed_tokens.weight.data_ptr()  # still tied
    assert load_network(tmp_path / "copy").config == ours.config


def test_the_output_layer_is_tied_and_a_decoder_alone_loads(tmp_path, tiny_target):
    net = load_network(save_tiny(tmp_path / "draft", seed=3, causal=True, tokenizer=False))
    assert not net.has_encoder and net.proj_out.weight is net.model.decoder.embed_tokens.weight
    assert tiny_target.net.proj_out.weight is tiny_target.net.model.decoder.embed_tokens.weight


def test_the_training_forward_is_transformers_decoder(tiny_dir):
    """What ``asr_spec distill`` trains through: whole causal sequences over encoder outputs, gradients included."""
    from transformers import WhisperForConditionalGeneration

    theirs = WhisperForConditionalGeneration.from_pretrained(tiny_dir).eval()
    ours = load_network(tiny_dir).requires_grad_(True)
    g = torch.Generator().manual_seed(0)
    memory = torch.randn(2, 30, ours.config.d_model, generator=g)
    tokens = torch.randint(0, 50000, (2, 9), generator=g)
    ref = theirs.model.decoder(input_ids=tokens, encoder_hidden_states=memory, use_cache=False).last_hidden_state
    got = ours.model.decoder(tokens, memory)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    got.sum().backward()
    assert ours.model.decoder.layers[0].fc1.weight.grad is not None


def test_config_keeps_what_it_does_not_use():
    c = Config.from_dict({"d_model": 64, "decoder_start_token_id": 50258, "architectures": ["X"]})
    assert c.d_model == 64 and c.to_dict()["decoder_start_token_id"] == 50258
    assert c.with_decoder_layers(2).decoder_layers == 2
    with pytest.raises(ValueError, match="gelu"):
        Config.from_dict({"activation_function": "relu"})
    assert set(Network(c, device="meta").state_dict()) >= {"proj_out.weight", "model.encoder.conv1.weight"}


def test_mel_filters_and_language_names_equal_transformers():
    from transformers.audio_utils import mel_filter_bank
    from transformers.models.whisper.tokenization_whisper import LANGUAGES as THEIRS

    from asr_spec.features import mel_filters
    from asr_spec.models.vocab import LANGUAGES

    for n in (80, 128):
        ref = mel_filter_bank(num_frequency_bins=201, num_mel_filters=n, min_frequency=0.0, max_frequency=8000,
                              sampling_rate=16000, norm="slaney", mel_scale="slaney")
        assert np.array_equal(mel_filters(n).astype(np.float32), ref.T.astype(np.float32)), n
    assert LANGUAGES == THEIRS


@pytest.mark.slow
def test_a_transcription_never_imports_transformers(tiny_dir):
    code = ("import sys, numpy as np\n"
            "from asr_spec.models.loader import ModelOptions, load\n"
            "from asr_spec.transcribe import Transcriber, TranscribeOptions\n"
            f"target, draft = load(ModelOptions({str(tiny_dir)!r}, 'layers:0'))\n"
            "Transcriber(target, draft).transcribe(np.zeros(16000, np.float32), TranscribeOptions(language='en'))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'torch._dynamo')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout[-2000:]


def test_the_encoder_layers_read_their_input_in_rows(tiny_target):
    """The convolutions' output is permuted to [B, T, D]; summed with the positions it is made contiguous once, so no
    layer works on a strided layout (which copied at every layer norm: 6-14 % of an encoder on a CPU).
    The bits are the same (test_models.py: transformers', bit for bit)."""
    encoder = tiny_target.net.model.encoder
    seen: list[bool] = []
    hooks = [layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0].is_contiguous()))
             for layer in encoder.layers]
    try:
        with torch.inference_mode():
            tiny_target.encode(torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(0)))
    finally:
        for hook in hooks:
            hook.remove()
    assert seen and all(seen), seen
