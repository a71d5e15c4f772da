"""``asr_spec distill`` end to end on a few real training clips and synthesized speech: it writes a draft
that loads, keeps decoding exact, and resumes from its checkpoint."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch
from conftest import DEV, system_tool
from safetensors.torch import load_file

from asr_spec.audio import load_audio
from asr_spec.features import log_mel, window
from asr_spec.models.loader import load_draft
from asr_spec.transcribe import Transcriber

pytestmark = pytest.mark.slow
TRAIN = DEV.parent / "train"


def distill(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asr_spec", "distill", *args], capture_output=True, text=True,
                          timeout=900)


def test_distill_writes_a_draft_that_decodes_exactly_and_resumes(tmp_path, base_model):
    system_tool("espeak-ng", "flite", "text2wave", install="sudo apt-get install espeak-ng (.ci/run installs it)")
    audio = tmp_path / "audio"
    audio.mkdir()
    for f in sorted((TRAIN / "audio" / "en").glob("*.flac"))[:6]:
        shutil.copy(f, audio)
    text = TRAIN / "text" / "gutenberg_doyle_wells.txt"
    out, work = tmp_path / "draft", tmp_path / "work"
    common = ["--target", "whisper-base", "--audio", str(audio), "--text", str(text), "--tts-clips", "4",
              "--batch", "4", "--out", str(out), "--work", str(work), "--session-seconds", "60"]
    r = distill(*common, "--steps", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("draft.safetensors", "asr_spec_draft.json", "README.md", "report.json"):
        assert (out / name).exists()
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 6 and report["examples"]["tts"] > 0 and report["examples"]["real"] > 0
    assert report["examples"]["session"] > 0  # windows of joined clips, prompted with the previous text
    assert any(e.prompt[0] == base_model.vocab.sot_prev for f in (work / "cache").glob("session-*.pt")
               for e in torch.load(f, weights_only=False))
    assert 0 <= report["held_aside_acceptance"] <= 1
    assert "asr_spec distill" in (out / "README.md").read_text()
    hours = report["audio_hours"]  # the real clips' length, summed from the audio itself
    real_s = sum(len(load_audio(f)) for f in audio.glob("*.flac")) / 16000
    assert hours["real"] * 3600 == pytest.approx(real_s, abs=15) and 0 < hours["tts"] and 0 < hours["session"]
    assert "Hours of audio by kind: real clips" in (out / "README.md").read_text()

    draft = load_draft(str(out), base_model)
    assert draft.decoder.head_ids is not None and draft.encoder is None
    tr = Transcriber(base_model, draft)
    mel = window(log_mel(load_audio(DEV / "LJ001-0002.wav")), 0)[None]
    memories = tr.encode(mel)
    prompt = tr.prompt([], "en", "transcribe", True)
    ref = tr.decode(memories, [prompt], k=0, use_draft=False)[0]
    spec = tr.decode(memories, [prompt], k=4)[0]
    assert spec.tokens == ref.tokens and spec.stats.drafted > 0

    r = distill(*common, "--steps", "6")  # same options: the checkpoint is complete, nothing to redo
    assert "resumed from step 6" in r.stderr
    assert json.loads((out / "report.json").read_text())["steps"] == 6
    r = distill(*common, "--steps", "8")  # a larger budget trains on from the checkpoint
    assert "resumed from step 6" in r.stderr, r.stderr[-3000:]
    assert [h["step"] for h in json.loads((out / "report.json").read_text())["history"]][-2:] == [6, 8]

    # a long run writes its draft at every checkpoint: stopped at any time, it leaves a draft that decodes exactly
    long = subprocess.Popen([sys.executable, "-m", "asr_spec", "distill", *common, "--steps", "400",
                             "--checkpoint-every", "2"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    try:
        while json.loads((out / "report.json").read_text())["steps"] < 12:
            assert long.poll() is None and time.monotonic() < deadline, "no checkpoint past step 10 in 300 s"
            time.sleep(0.5)
    finally:
        long.kill()
        stderr = long.communicate(timeout=60)[1]
    assert "resumed from step 8" in stderr, stderr[-3000:]
    stopped = json.loads((out / "report.json").read_text())
    assert stopped["steps"] >= 12 and stopped["steps"] % 2 == 0
    assert json.loads((out / "asr_spec_draft.json").read_text())["training"]["steps"] >= stopped["steps"]
    assert int(re.search(r"Seed 0; (\d+) steps", (out / "README.md").read_text())[1]) >= stopped["steps"]
    draft = load_draft(str(out), base_model)
    spec = Transcriber(base_model, draft).decode(memories, [prompt], k=4)[0]
    assert spec.tokens == ref.tokens
    stopped = json.loads((out / "report.json").read_text())  # the run may have written one more before it was killed

    tuned = tmp_path / "tuned"  # fine-tuning the draft keeps its shortlist and stays exact
    # ... with augmented copies of the real clips and on-policy batches (the draft's own paths)
    # ... on two of the real clips one by one (the recordings still join all six)
    # ... and two of the synthesized clips taken from a folder (as made on a machine with the engines for one without)
    r = distill(*[a if a != str(out) else str(tuned) for a in common], "--steps", "2", "--init", str(out),
                "--augment", "1", "--on-policy", "0.5", "--real-clips", "2", "--tts-audio", str(work / "cache" / "tts"),
                "--tts-clips", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    tuned_report = json.loads((tuned / "report.json").read_text())
    examples = tuned_report["examples"]
    # the run it continues counts in its training time, and a draft continued from it would list both
    assert [(r["steps"], r["draft"]) for r in tuned_report["earlier_runs"]] == [(stopped["steps"], str(out))]
    assert "Trained in 2 runs" in (tuned / "README.md").read_text()
    assert json.loads((tuned / "asr_spec_draft.json").read_text())["training"]["earlier_runs"] == \
        tuned_report["earlier_runs"]
    assert examples["aug"] > 0 and examples["real"] < report["examples"]["real"]
    assert 0 < examples["tts"] < report["examples"]["tts"]
    assert examples["session"] == report["examples"]["session"]
    assert json.loads((tuned / "asr_spec_draft.json").read_text())["head_ids"] == draft.decoder.head_ids.tolist()
    spec = Transcriber(base_model, load_draft(str(tuned), base_model)).decode(memories, [prompt], k=4)[0]
    assert spec.tokens == ref.tokens

    # a larger --head-size widens a continued draft's output layer: its trained rows kept, each new row the target's
    # embedding of its token (the target's own output layer), and decoding stays exact
    wide = tmp_path / "wide"
    text_tokens = sum(t < base_model.vocab.eot for t in draft.decoder.head_ids.tolist())
    r = distill(*[a if a != str(out) else str(wide) for a in common], "--minutes", "0", "--init", str(out),
                "--head-size", str(text_tokens + 300))
    assert r.returncode == 0, r.stderr[-3000:]
    before = json.loads((out / "asr_spec_draft.json").read_text())["head_ids"]
    after = json.loads((wide / "asr_spec_draft.json").read_text())["head_ids"]
    assert set(before) < set(after) and len(after) == len(before) + 300
    old_rows = load_file(str(out / "draft.safetensors"))["head.weight"]
    new_rows = load_file(str(wide / "draft.safetensors"))["head.weight"]
    where = {t: i for i, t in enumerate(after)}
    assert torch.equal(new_rows[[where[t] for t in before]], old_rows)
    added = sorted(set(after) - set(before))
    emb = base_model.net.model.decoder.embed_tokens.weight.detach()
    assert torch.equal(new_rows[[where[t] for t in added]], emb[added].half())
    assert "widened from the initial draft's" in (wide / "README.md").read_text()
    spec = Transcriber(base_model, load_draft(str(wide), base_model)).decode(memories, [prompt], k=4)[0]
    assert spec.tokens == ref.tokens

    # --layers with --init deepens a draft: its own layers kept in their order, each added one the target's layer with
    # its three output projections zeroed, so that the deeper draft proposes exactly what it continues until trained
    deep = tmp_path / "deep"
    r = distill(*[a if a != str(out) else str(deep) for a in common], "--minutes", "0", "--init", str(out),
                "--layers", "0,2,5")
    assert r.returncode == 0, r.stderr[-3000:]
    meta = json.loads((deep / "asr_spec_draft.json").read_text())
    assert meta["decoder_layers"] == 3 and meta["training"]["layers_from"] == [0, 2, 5]
    new = load_file(str(deep / "draft.safetensors"))
    for name, v in load_file(str(out / "draft.safetensors")).items():  # its layer 1 is now layer 2
        assert torch.equal(new[name.replace("layers.1.", "layers.2.")], v), name
    added = base_model.net.model.decoder.layers[2]
    assert torch.equal(new["layers.1.fc1.weight"], added.fc1.weight.half())
    assert torch.equal(new["layers.1.self_attn.q_proj.weight"], added.self_attn.q_proj.weight.half())
    for proj in ("self_attn.out_proj", "encoder_attn.out_proj", "fc2"):
        assert not new[f"layers.1.{proj}.weight"].any() and not new[f"layers.1.{proj}.bias"].any()
    assert "output projections zeroed" in (deep / "README.md").read_text()
    before = Transcriber(base_model, draft).decode(memories, [prompt], k=4)[0]
    after = Transcriber(base_model, load_draft(str(deep), base_model)).decode(memories, [prompt], k=4)[0]
    assert after.tokens == ref.tokens
    assert (after.stats.drafted, after.stats.accepted, after.stats.target_passes) == \
        (before.stats.drafted, before.stats.accepted, before.stats.target_passes) and before.stats.drafted > 0
    r = distill(*[a if a != str(out) else str(deep) for a in common], "--minutes", "0", "--init", str(out),
                "--layers", "5,0")
    assert r.returncode == 1 and "must keep the draft's own layers 0,5 in their order" in r.stderr, r.stderr[-3000:]
