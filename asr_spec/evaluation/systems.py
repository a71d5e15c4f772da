"""The systems ``asr_spec eval`` compares: ours (target-only, speculative greedy and sampling, the draft
alone) and peers (transformers generate, transformers assisted generation, faster-whisper, whisper.cpp). A peer's
name may end in ``-beamN``: its beam search with N beams (faster-whisper's and whisper.cpp's default is 5)."""
from __future__ import annotations

import importlib.util
import re
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from ..audio import SAMPLE_RATE
from ..models.compute import COMPUTE_TYPES

OURS = ("target", "spec", "spec-fixed", "spec-adaptive", "spec-chunked", "spec-fp32draft", "spec-fullview", "spec-sample", "target-sample",
        "draft")
PEERS = ("hf", "hf-assisted", "faster-whisper", "faster-whisper-batched", "whisper.cpp", "openai-whisper")
BEAMED = ("faster-whisper", "faster-whisper-batched", "whisper.cpp", "openai-whisper")  # peers that take -beamN
# ours take it too: target-beam5 is openai-whisper's beam search, spec-beam5 the same speculatively


@dataclass(frozen=True)
class SystemSpec:
    name: str  # unique display name, e.g. spec-k4, faster-whisper-int8
    kind: str  # one of OURS or PEERS
    k: int = 0
    draft_stop: float = 0.0
    temperature: float = 0.0
    seed: int = 0
    compute_type: str = ""  # ours: "" = the run's --compute-type; faster-whisper: its compute_type
    adaptive_k: bool = False  # spec-adaptive: each pass's draft length by measured cost (spec, spec-fixed: always k)
    chunked: bool = False  # spec-chunked: a file's speech chunks decoded side by side without prompts
    batch_size: int = 1  # ours: windows in flight (files, or chunks); faster-whisper-batched: its batch size
    draft_int8: bool | None = None  # the draft's linear layers in int8 (None: where the CPU has the kernels)
    draft_full_view: bool = False  # the draft reads the whole 30 s window's encoder output (default: the audio's)
    baseline: str = "target"  # the target-only run this one is compared with (same compute type and mode)
    beam: int = 1  # peers: beams of their beam search (1: greedy)


@dataclass(frozen=True)
class Setup:
    model: str
    draft: str
    language: str | None
    threads: int
    compute_type: str = "float32"  # our systems' compute type where their name gives none
    encoder_window: str = "full"  # our systems' encoder input: padded 30 s windows, or only the audio
    hotwords: str | None = None  # ours (TranscribeOptions.hotwords) and faster-whisper's
    device: str = "cpu"  # every system's device: torch's name (cpu, cuda, cuda:1); faster-whisper's cpu or cuda
    speculation: str = "auto"  # ours: draft where measured to pay (measured first where it is not), or "on"
    window_padding: str = "audio"  # ours: what follows a short window's audio (TranscribeOptions.window_padding)


@dataclass
class Output:
    text: str
    wall_s: float
    encoder_s: float | None = None
    decode_s: float | None = None
    stats: dict | None = None


def expand(systems: list[str], ks: list[int], temperature: float, seeds: int,
           stops: list[float] = [0.0], batch_sizes: list[int] = [1]) -> list[SystemSpec]:  # noqa: B006 (never mutated)
    """The runs of each named system: one per K and draft-stop (spec), seed (sampling), compute type
    (faster-whisper) and batch size (ours and faster-whisper-batched; "-b8" in the name when above 1). Our systems
    take a compute type as a suffix (spec-int8, target-bfloat16, spec-sample-int8); faster-whisper any of
    CTranslate2's (faster-whisper-int8_float32); alone it runs int8 and float32."""
    out: list[SystemSpec] = []
    for full in systems:
        name, beam = full, 1
        if m := re.fullmatch(r"(.+)-beam(\d+)", full):
            name, beam = m.group(1), int(m.group(2))
        before = len(out)
        stem, _, suffix = name.rpartition("-")
        s, ct = (stem, suffix) if suffix in COMPUTE_TYPES and stem in OURS else (name, "")
        tag = f"-{ct}" if ct else ""
        if s in ("spec", "spec-fixed", "spec-adaptive", "spec-chunked", "spec-fp32draft", "spec-fullview"):
            out += [SystemSpec(f"{s}-k{k}" + (f"-stop{p:g}" if p else "") + tag, "spec", k=k, draft_stop=p,
                               compute_type=ct, adaptive_k=s == "spec-adaptive", chunked=s == "spec-chunked",
                               draft_int8=False if s == "spec-fp32draft" else None,
                               draft_full_view=s == "spec-fullview", baseline="target" + tag) for k in ks for p in stops]
        elif s in ("spec-sample", "target-sample"):  # same seeds: the same text (sampling is keyed, not drawn)
            out += [SystemSpec(f"{s}-t{temperature}-s{i}{tag}", s, k=ks[0], draft_stop=stops[0], compute_type=ct,
                               temperature=temperature, seed=i, baseline=f"target-sample-t{temperature}-s{i}{tag}")
                    for i in range(seeds)]
        elif s in ("faster-whisper", "faster-whisper-batched"):
            out += [SystemSpec(f"{s}-{c}", s, compute_type=c) for c in ("int8", "float32")]
        elif stem in ("faster-whisper", "faster-whisper-batched") and suffix in COMPUTE_TYPES:
            out.append(SystemSpec(name, stem, compute_type=suffix))  # one compute type only
        elif s in OURS + PEERS:
            out.append(SystemSpec(s + tag, s, compute_type=ct, baseline="target" + tag))
        else:
            raise ValueError(f"unknown system {full!r}; choose from {', '.join(OURS + PEERS)} (peers of {', '.join(BEAMED)} "
                             "also as NAME-beamN)")
        if beam > 1:
            if any(spec.kind not in BEAMED + ("target", "spec") for spec in out[before:]):
                raise ValueError(f"{full!r}: -beamN is for target, spec and the peers {', '.join(BEAMED)}")
            out[before:] = [replace(spec, name=f"{spec.name}-beam{beam}", beam=beam, baseline=spec.baseline + f"-beam{beam}")
                            for spec in out[before:]]
    batched = lambda spec: spec.kind in OURS or spec.kind == "faster-whisper-batched"  # noqa: E731
    return [replace(spec, name=spec.name + at(n), batch_size=n,
                    baseline=spec.baseline + ("" if spec.kind == "target" else at(n))) if batched(spec) else spec
            for spec in out for n in (batch_sizes if batched(spec) else [None])]


def at(batch_size: int) -> str:
    """A batched run's name suffix ("-b8"; none at 1). Our systems at a batch size are compared with target-only at
    the same one (target-only's own runs with target-only at batch 1: what batching alone buys)."""
    return f"-b{batch_size}" if batch_size > 1 else ""


def missing(spec: SystemSpec) -> str | None:
    """Why a peer cannot run here (its optional package is absent), or None."""
    need = {"whisper.cpp": "pywhispercpp", "openai-whisper": "whisper"}.get(spec.kind) or \
        ("faster_whisper" if spec.kind.startswith("faster-whisper") else None)
    if need and importlib.util.find_spec(need) is None:
        return f"{need.replace('_', '-')} is not installed (pip install 'asr_spec[peers]')"
    return None


Transcribe = Callable[[list[np.ndarray]], list[Output]]


def resolved_type(spec: SystemSpec, setup: Setup) -> str:
    """The concrete compute type a system runs at (CTranslate2's int8 on a CPU is int8 weights with float32
    activations: int8_float32), so that like-for-like pairs can be named."""
    from ..models.loader import ModelOptions

    if spec.kind in OURS:  # auto: the type measured fastest for the model here (cached: the worker runs the same)
        return ModelOptions(setup.model, None, setup.device, spec.compute_type or setup.compute_type,
                            setup.threads).precision().name
    if spec.kind.startswith("faster-whisper"):
        return {"int8": "int8_float32", "auto": "int8_float32", "default": "float32"}.get(spec.compute_type, spec.compute_type)
    return "float16" if spec.kind == "whisper.cpp" else "float32"  # whisper.cpp: the ggml file's float16 weights


def build(spec: SystemSpec, setup: Setup) -> Transcribe:
    """Load the models of one system; return a function that transcribes a list of utterances (outputs in
    their order). With files in flight together, an output's ``wall_s`` is the time since the previous file
    finished: the sum over a run is its wall time, a single value means little."""
    if spec.kind in OURS:
        return _ours(spec, setup)
    if spec.kind in ("hf", "hf-assisted"):
        return _hf(spec, setup)
    if spec.kind == "whisper.cpp":
        return _whisper_cpp(spec, setup)
    if spec.kind == "openai-whisper":
        return _openai_whisper(spec, setup)
    return _faster_whisper(spec, setup)


def _ours(spec: SystemSpec, setup: Setup) -> Transcribe:
    from dataclasses import replace

    from ..decoding.beam import BeamOptions
    from ..measure import settle
    from ..models.loader import ModelOptions, load_draft, load_target
    from ..recognizer import Checks, temperature_ladder
    from ..transcribe import TranscribeOptions, Transcriber

    options = ModelOptions(setup.model, setup.draft, setup.device, spec.compute_type or setup.compute_type,
                           setup.threads, setup.speculation)
    target = load_target(setup.model, setup.device, options.precision())
    draft = load_draft(setup.draft, target, spec.draft_int8) if spec.kind not in ("target", "target-sample") else None
    if draft is not None and spec.kind != "draft":  # the product's drafting widths, measured now where not yet
        draft = settle(options, target, replace(draft, widths=options.draft_widths(target.precision.name)))
        print(f"{spec.name}: {draft.widths.describe()}", file=sys.stderr)
    tr = Transcriber(draft.alone(target)) if spec.kind == "draft" else Transcriber(target, draft)
    # the draft alone: one greedy attempt (a failing draft would otherwise retry at every temperature)
    temps = (0.0,) if spec.kind == "draft" else temperature_ladder(spec.temperature)
    opts = TranscribeOptions(language=setup.language, k=spec.k, draft_stop=spec.draft_stop, checks=Checks(temps, seed=spec.seed),
                             encoder_window=setup.encoder_window, window_padding=setup.window_padding,
                             adaptive_k=spec.adaptive_k, chunked=spec.chunked,
                             hotwords=setup.hotwords, beam=BeamOptions(spec.beam) if spec.beam > 1 else None,
                             **({"draft_margin": None} if spec.draft_full_view else {}))

    def run(audios: list[np.ndarray]) -> list[Output]:
        outputs: list[Output | None] = [None] * len(audios)
        last = time.perf_counter()
        for i, t in tr.transcribe_many([(i, lambda a=a: a) for i, a in enumerate(audios)], opts, spec.batch_size):
            now = time.perf_counter()
            st = t.stats
            outputs[i] = Output(t.text, now - last, st.encoder_seconds, st.decode_seconds,
                                {**st.as_dict(), "accepted_at": st.decode.accepted_at})
            last = now
        return outputs

    return run


def _each(one: Callable[[np.ndarray], Output]) -> Transcribe:
    return lambda audios: [one(a) for a in audios]


def _hf(spec: SystemSpec, setup: Setup) -> Transcribe:
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForCausalLM, WhisperForConditionalGeneration

    from ..models.loader import load_draft, load_target
    from ..models.sources import resolve

    target = load_target(setup.model, setup.device)
    model = WhisperForConditionalGeneration.from_pretrained(resolve(setup.model)).to(setup.device).eval()
    assistant = None
    if spec.kind == "hf-assisted":  # our draft's network as transformers' decoder-only Whisper
        net = load_draft(setup.draft, target).net
        if net.has_encoder:  # a full smaller Whisper
            assistant = WhisperForConditionalGeneration.from_pretrained(resolve(setup.draft)).to(setup.device).eval()
    if spec.kind == "hf-assisted" and assistant is None:
        assistant = WhisperForCausalLM(WhisperConfig(**net.config.to_dict())).to(setup.device).eval()
        assistant.load_state_dict(net.state_dict(), strict=False)
        assistant.proj_out.weight = torch.nn.Parameter(net.proj_out.weight.detach().clone(), requires_grad=False)
    fe = WhisperFeatureExtractor.from_pretrained(resolve(setup.model))

    def run(audio: np.ndarray) -> Output:
        t0 = time.perf_counter()
        long = len(audio) > fe.n_samples
        feats = fe(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", return_attention_mask=True,
                   **({"truncation": False, "padding": "longest"} if long else {}))
        feats = feats.to(target.decoder.device)
        kwargs = {"attention_mask": feats.attention_mask} if long else {}
        if assistant is not None:
            kwargs["assistant_model"] = assistant
        with torch.inference_mode():
            ids = model.generate(feats.input_features, language=setup.language, task="transcribe",
                                     return_timestamps=True, **kwargs)  # timestamp mode, as ours decodes
        text = target.tokenizer.decode(ids[0].tolist()).strip()
        return Output(text, time.perf_counter() - t0)

    return _each(run)


def _faster_whisper(spec: SystemSpec, setup: Setup) -> Transcribe:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from ..models.sources import embedded_ct2_dir, is_embedded

    if not is_embedded(setup.model):
        raise ValueError("faster-whisper runs only on the embedded model's CTranslate2 weights here")
    device = "cuda" if setup.device.startswith("cuda") else "cpu"
    model = WhisperModel(str(embedded_ct2_dir()), device=device, compute_type=spec.compute_type,
                         cpu_threads=setup.threads)
    if spec.kind == "faster-whisper-batched":  # its batched pipeline: a file's voice-activity chunks, no prompts
        pipeline = BatchedInferencePipeline(model)
        transcribe = partial(pipeline.transcribe, batch_size=spec.batch_size, hotwords=setup.hotwords)
    else:  # Whisper's sequential loop
        transcribe = partial(model.transcribe, vad_filter=False, hotwords=setup.hotwords)

    def run(audio: np.ndarray) -> Output:
        t0 = time.perf_counter()
        segments, _ = transcribe(audio, beam_size=spec.beam, language=setup.language)
        text = "".join(s.text for s in segments).strip()
        return Output(text, time.perf_counter() - t0)

    return _each(run)


def _whisper_cpp(spec: SystemSpec, setup: Setup) -> Transcribe:
    """whisper.cpp through pywhispercpp (its wheel bundles the library) on the model as a ggml file (converted once
    into the cache, ``ggml.py``), its defaults otherwise: greedy, or beam search with ``spec.beam`` beams."""
    from pywhispercpp.model import Model

    from ..models.cache import built, cache_dir
    from ..models.sources import resolve
    from .ggml import write_ggml

    if setup.device != "cpu":
        raise ValueError("whisper.cpp runs here on the CPU only (pywhispercpp's wheel)")
    source = resolve(setup.model)
    name = Path(setup.model).name if Path(setup.model).is_dir() else setup.model
    folder = built(cache_dir() / f"{name}-ggml", lambda out: write_ggml(source, out / "ggml-model.bin"),
                   f"{name} as a ggml model file")
    beams = {"params_sampling_strategy": 1, "beam_search": {"beam_size": spec.beam, "patience": -1.0}} \
        if spec.beam > 1 else {}
    model = Model(str(folder / "ggml-model.bin"), n_threads=setup.threads or 4, language=setup.language or "auto",
                  print_progress=False, print_realtime=False, redirect_whispercpp_logs_to=None, **beams)

    def run(audio: np.ndarray) -> Output:
        t0 = time.perf_counter()
        # its segments' texts come stripped: joined with a space, as whisper.cpp's own CLI prints them
        text = " ".join(t for s in model.transcribe(audio.astype(np.float32)) if (t := s.text.strip()))
        return Output(text, time.perf_counter() - t0)

    return _each(run)


def openai_whisper_model(model: str, device: str = "cpu"):
    """A transformers-format Whisper (the embedded one, a folder, an id) in openai-whisper's own ``Whisper`` module:
    the same weights under its names (``ggml.openai_name``), float32."""
    from whisper.model import ModelDimensions
    from whisper.model import Whisper as OpenAIWhisper

    from ..models.network import Config, read_weights
    from ..models.sources import resolve
    from .ggml import openai_name

    path = resolve(model)
    c = Config.from_dir(path)
    dims = ModelDimensions(n_mels=c.num_mel_bins, n_audio_ctx=c.max_source_positions, n_audio_state=c.d_model,
                           n_audio_head=c.encoder_attention_heads, n_audio_layer=c.encoder_layers, n_vocab=c.vocab_size,
                           n_text_ctx=c.max_target_positions, n_text_state=c.d_model,
                           n_text_head=c.decoder_attention_heads, n_text_layer=c.decoder_layers)
    net = OpenAIWhisper(dims)
    state = {name: t.float() for k, t in read_weights(path).items() if (name := openai_name(k)) is not None}
    net.load_state_dict(state)
    return net.to(device).eval()


def _openai_whisper(spec: SystemSpec, setup: Setup) -> Transcribe:
    """openai-whisper's ``transcribe()`` (the function its CLI runs) on the same weights, float32: its defaults
    (temperature fallback; greedy), or with ``spec.beam`` beams and as many candidates at the fallback temperatures
    (its CLI's beam 5, best of 5)."""
    import whisper

    model = openai_whisper_model(setup.model, setup.device)
    beams = {"beam_size": spec.beam, "best_of": spec.beam} if spec.beam > 1 else {}

    def run(audio: np.ndarray) -> Output:
        t0 = time.perf_counter()
        result = whisper.transcribe(model, audio.astype(np.float32), language=setup.language, fp16=False, **beams)
        return Output(result["text"].strip(), time.perf_counter() - t0)

    return _each(run)
