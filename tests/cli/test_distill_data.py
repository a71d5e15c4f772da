"""Distillation's data, fast (tiny random models): augmented copies of real clips, and on-policy examples — the
draft's own proposals, each labelled by the target's choice after them — fed the way the batcher feeds them."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import DEV, system_tool

from asr_spec.audio import SAMPLE, SAMPLE_RATE, load_audio
from asr_spec.distill.augment import KINDS, augment, convolved
from asr_spec.distill.data import Example, augmented, label, shard_examples, synthesize
from asr_spec.distill.onpolicy import on_policy
from asr_spec.distill.train import Batcher
from asr_spec.distill.tts import Voice, festival_voices, random_voice, speak
from asr_spec.models.loader import load_draft


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    return load_audio(SAMPLE)[: 3 * SAMPLE_RATE]


@pytest.mark.parametrize("kind", KINDS)
def test_each_augmentation_changes_the_audio_and_repeats_with_its_seed(clip, kind):
    got, changed = augment(clip, random.Random(3), kind)
    again = augment(clip, random.Random(3), kind)[1]
    assert got == kind and np.array_equal(changed, again) and changed.dtype == np.float32
    assert np.isfinite(changed).all() and np.abs(changed).max() <= 1.0
    if kind == "speed":
        assert 0.85 * len(clip) < len(changed) < 1.15 * len(clip) and len(changed) != len(clip)
    else:
        assert len(changed) == len(clip) and not np.allclose(changed, clip, atol=1e-3)
    with pytest.raises(ValueError, match="unknown augmentation"):
        augment(clip, random.Random(0), "echo")


def test_augmented_copies_are_named_by_their_kind_and_made_the_same_on_a_rerun(clip):
    copies = augmented([("a@0", "real", clip)], 3, seed=0)
    assert [c[1] for c in copies] == ["aug"] * 3 and all(c[0].startswith("a@0~") for c in copies)
    assert all(np.array_equal(x[2], y[2]) for x, y in zip(copies, augmented([("a@0", "real", clip)], 3, seed=0)))


@torch.no_grad()
def test_on_policy_examples_feed_the_drafts_tokens_and_carry_the_targets_choice_after_them(short_target):
    """Each example's inputs are the draft's greedy tokens after a cut of the original labels; its labels are the
    target's argmax after each of them (checked against the target itself, teacher-forced), and the batcher feeds
    exactly those inputs."""
    v, dec = short_target.vocab, short_target.decoder
    draft = load_draft("layers:0", short_target)
    g = torch.Generator().manual_seed(0)
    prompt = v.sot_sequence("en") + [v.no_timestamps]
    examples = [Example(f"e{i}", "real", torch.randn(20, short_target.config.d_model, generator=g).half(), prompt,
                        torch.randint(100, 5000, (6,), generator=g).tolist() + [v.eot],
                        torch.zeros(7, 4, dtype=torch.int32), torch.zeros(7, 4, dtype=torch.float16)) for i in range(3)]
    out = on_policy(draft.net, draft.net.proj_out.weight, None, short_target, examples, 4, 4, random.Random(1))
    for ex, original in zip(out, examples):
        assert ex.source == "policy" and len(ex.inputs) == 4 and len(ex.labels) == 5
        assert ex.prompt[:len(prompt)] == prompt and ex.prompt[len(prompt):] == original.labels[:len(ex.prompt) - len(prompt)]
        seq = ex.prompt + ex.inputs
        logits = dec(dec.new_cache(ex.memory[None].float(), len(seq)), torch.tensor([seq]),
                     torch.arange(len(seq))[None])[0]
        assert ex.labels == logits[len(ex.prompt) - 1:].argmax(-1).tolist()
        assert ex.top_ids[:, 0].tolist() == ex.labels
    x, y, *_ = Batcher(None, v.size, v.eot)(out[:1])
    assert x[0, :len(out[0].prompt) + 4].tolist() == out[0].prompt + out[0].inputs
    assert y[0, len(out[0].prompt) - 1:len(out[0].prompt) + 4].tolist() == out[0].labels


def test_reverberation_by_fft_is_the_direct_convolution():
    g = np.random.default_rng(0)
    x, ir = g.standard_normal(5000).astype(np.float32), g.standard_normal(700).astype(np.float32)
    assert np.allclose(convolved(x, ir), np.convolve(x, ir)[:5000], atol=1e-3)
    assert not np.allclose(convolved(x, ir), np.convolve(x, ir[::-1])[:5000], atol=1e-3)  # a wrong kernel fails


def test_a_longer_synthesis_run_extends_a_shorter_ones_clips(tmp_path):
    """Clip i's text and voice do not depend on how many clips are asked for, so a run with more clips reuses the
    clips (and their labels) of a run with fewer: the same first clips, sample for sample (voices drawn after all
    passages, as before, gave clip 0 another voice in a longer run)."""
    system_tool("espeak-ng", install="sudo apt-get install espeak-ng (.ci/run installs it)")
    text = [DEV.parent / "train" / "text" / "gutenberg_doyle_wells.txt"]
    few = synthesize(text, 3, tmp_path / "few", ["espeak-ng"], seed=0)
    more = synthesize(text, 6, tmp_path / "more", ["espeak-ng"], seed=0)
    assert len(few) == 3 and len(more) == 6 and [p.name for p in few] == [p.name for p in more[:3]]
    assert all(np.array_equal(load_audio(a), load_audio(b)) for a, b in zip(few, more))


def test_every_installed_festival_voice_speaks_and_is_drawn(tmp_path):
    """Each festival voice Debian installed (kal_diphone; the HTS voice of festvox-us-slt-hts where present) says a
    sentence, and synthesis draws among them; a folder without voices falls back to festival's default."""
    system_tool("text2wave", install="sudo apt-get install festival (.ci/run installs it)")
    voices = festival_voices()
    for name in voices:
        speak("The draft proposes and the target decides.", Voice("festival", name, 1.0), tmp_path / f"{name}.wav")
        assert len(load_audio(tmp_path / f"{name}.wav")) > SAMPLE_RATE // 2, name
    drawn = {random_voice(random.Random(i), ["festival"]).name for i in range(40)}
    assert drawn == set(voices)
    assert festival_voices(tmp_path / "none") == ["kal_diphone"]
    (tmp_path / "voices" / "us" / "b_voice").mkdir(parents=True)
    (tmp_path / "voices" / "english" / "a_voice").mkdir(parents=True)
    (tmp_path / "voices" / "spanish" / "c_voice").mkdir(parents=True)
    assert festival_voices(tmp_path / "voices") == ["a_voice", "b_voice"]


def test_a_label_shard_labels_each_clip_once_and_loses_none(tmp_path, short_target, clip):
    """A shard keeps the ids of the clips it labelled: a run with fewer clips ends inside it, a later run with more
    labels only the clips it lacks, and a clip that gave no example (a loop, silence) is not labelled again."""
    batch = [(f"c{i}@0", "real", clip[i * 8000:]) for i in range(3)]
    asked: list[list[str]] = []

    def labeller(todo):
        asked.append([b[0] for _, b in todo])
        return [e for e in label(short_target, [b for _, b in todo], 4, timestamps=True) if e.id != "c1@0"]

    def ids(examples):
        return [e.id for e in examples]

    shard = tmp_path / "real-00000.pt"
    first = ids(shard_examples(shard, batch[:2], labeller))
    assert asked == [["c0@0", "c1@0"]] and set(first) <= {"c0@0"}
    every = ids(shard_examples(shard, batch, labeller))
    assert asked == [["c0@0", "c1@0"], ["c2@0"]] and every[:len(first)] == first
    assert ids(shard_examples(shard, batch, labeller)) == every and len(asked) == 2  # nothing labelled twice
    assert ids(shard_examples(shard, batch[2:], labeller)) == [i for i in every if i == "c2@0"]
    # a shard written before the ids were kept: the clips behind its examples count as labelled
    torch.save(shard_examples(shard, batch, labeller), shard)
    assert ids(shard_examples(shard, batch[:1], labeller)) == [i for i in every if i == "c0@0"] and len(asked) == 2
