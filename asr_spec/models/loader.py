"""One model loader: a target from any source (models/sources.py: the embedded default, a transformers Whisper id or a
local directory) at a compute type, and the drafts that go with it. The networks are our own plain-torch modules
(models/network.py) read from transformers' directory format."""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from . import EMBEDDED, auto
from .cache import sha256
from .compute import Precision, machine, resolve_compute_type
from .kv_decoder import CachedDecoder
from .linear import quantize_linears
from .network import Config, DecoderLayer, Network, load_network
from .sources import ModelError, cache_dir, generation_config, is_embedded, resolve
from .vocab import WhisperTokenizer

DRAFT_META = "asr_spec_draft.json"


@dataclass
class Whisper:
    """A target model: its network, our static-cache decoder, tokenizer and special ids."""

    net: Network
    tokenizer: WhisperTokenizer
    decoder: CachedDecoder
    encoder: nn.Module
    name: str
    precision: Precision = Precision("float32", torch.float32, False)
    generation: dict = field(default_factory=dict)  # generation_config.json (alignment heads, suppress lists)

    @property
    def config(self) -> Config:
        return self.net.config

    @property
    def n_mels(self) -> int:
        return self.config.num_mel_bins

    @property
    def vocab(self):
        return self.tokenizer.vocab

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """Encoder output [B, frames / 2, D] for log-mel [B, n_mels, frames] (``network.Encoder.forward``)."""
        return self.encoder(mel.to(self.decoder.device))


class AnyLengthEncoder(nn.Module):
    """A Whisper encoder (any even number of frames, see ``network.Encoder.forward``) computing in its weights' float
    type (with ``int8``: a copy whose linear layers run with int8 weights and per-row int8 activations) and returning
    float32."""

    def __init__(self, encoder: nn.Module, int8: bool = False):
        super().__init__()
        self.inner = quantize_linears(copy.deepcopy(encoder)) if int8 else encoder
        self.dtype = encoder.conv1.weight.dtype

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.inner(mel.to(self.dtype)).float()


@dataclass
class Draft:
    """A draft decoder. ``encoder`` is None when it reads the target's encoder output (shared)."""

    decoder: CachedDecoder
    encoder: nn.Module | None
    name: str
    net: Network  # its network (a decoder alone, or a full smaller Whisper), for peers such as assisted generation
    widths: auto.DraftWidths = auto.ALWAYS  # the batch widths at which it drafts (``load``: where it pays here)

    @torch.inference_mode()
    def encoder_out(self, mel: torch.Tensor, target_out: torch.Tensor) -> torch.Tensor:
        if self.encoder is None:
            return target_out
        return self.encoder(mel.to(self.decoder.device))

    def alone(self, target: Whisper) -> Whisper:
        """The draft decoding by itself (with the target's tokenizer and, if it has none, encoder)."""
        return replace(target, decoder=self.decoder, encoder=self.encoder or target.encoder, name=f"draft {self.name}")


def load_tokenizer(spec: str = EMBEDDED) -> WhisperTokenizer:
    """The tokenizer of a model, without loading its weights."""
    path = resolve(spec)
    return _tokenizer(spec, path, _readable(spec, path, "config.json", lambda: Config.from_dir(path)).vocab_size)


def _readable(spec: str, path: Path, what: str, read: Callable[[], object]):
    """``read()``, or a ModelError naming the file of ``path`` that could not be read."""
    try:
        return read()
    except Exception as e:  # noqa: BLE001 - any damage becomes one message naming the file
        where = f"{spec} ({path})" if str(path) != spec else spec
        raise ModelError(f"{where}: cannot read its {what} ({type(e).__name__}: {str(e)[:200]}); "
                         f"{_remedy(path)}") from None


def _remedy(path: Path) -> str:
    return ("delete that folder and run again: it is built again from its package" if cache_dir() in path.parents
            else "is the folder a whole transformers-format Whisper model?")


def _tokenizer(spec: str, path: Path, vocab_size: int) -> WhisperTokenizer:
    if not (path / "tokenizer.json").exists():
        raise ModelError(f"{spec}: no tokenizer.json beside the model")
    generation = _readable(spec, path, "generation_config.json", lambda: generation_config(path))
    return _readable(spec, path, "tokenizer.json", lambda: WhisperTokenizer.from_dir(path, generation, vocab_size))


def load_target(spec: str = EMBEDDED, device: str = "cpu", compute_type: str | Precision = "float32") -> Whisper:
    """The target at ``compute_type`` (a name, resolved for ``device``, or a resolved :class:`Precision`): weights
    in its float type, and with int8 the decoder's and the encoder's linear layers in int8, exact per row."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"--device {device}: this torch ({torch.__version__}) has no CUDA, or no GPU is visible "
                         "(a CUDA build of torch: docs/gpu.md)")
    path = resolve(spec)
    p = compute_type if isinstance(compute_type, Precision) else \
        ModelOptions(spec, None, device, compute_type).precision()
    if path.is_dir() and not (path / "config.json").exists():
        raise ModelError(f"{spec}: not a Whisper model: no config.json in it; {_remedy(path)}")
    net = _readable(spec, path, "weights as a Whisper model", lambda: load_network(path, p.float, device))
    if not net.has_encoder:
        raise ModelError(f"{spec}: a decoder alone (a draft), not a whole Whisper")
    tokenizer = _tokenizer(spec, path, net.config.vocab_size)
    generation = generation_config(path)
    how = ", auto: a guess, not measured here yet" if p.guessed else ", auto" if compute_type == "auto" else ""
    name = str(spec) if p.name == "float32" and not how else f"{spec} ({p.name}{how})"
    return Whisper(net, tokenizer, CachedDecoder(net.model.decoder, net.proj_out.weight, int8="rows" if p.int8 else None,
                                                 exact=True),
                   AnyLengthEncoder(net.model.encoder, p.int8), name, p, generation)


def truncated_draft(target: Whisper, layers: list[int]) -> Network:
    """An (untrained) draft made of some of the target's decoder layers, in the distil-Whisper layout."""
    n = target.config.decoder_layers
    if not layers or any(not 0 <= i < n for i in layers):
        raise ModelError(f"draft layers {layers}: the target decoder has layers 0..{n - 1}")
    draft = distilled_decoder(target, len(layers))
    src, dst = target.net.model.decoder, draft.model.decoder
    dst.layer_norm.load_state_dict(src.layer_norm.state_dict())
    for j, i in enumerate(layers):
        dst.layers[j].load_state_dict(src.layers[i].state_dict())
    return draft.to(target.net.dtype).eval()


def _check(target: Whisper, name: str, vocab_size: int, tokenizer_dir: Path | None, width: int | None,
           n_mels: int | None) -> None:
    problems = []
    if vocab_size != target.config.vocab_size:
        problems.append(f"vocabulary size {vocab_size} != target's {target.config.vocab_size}")
    if tokenizer_dir is not None and (tokenizer_dir / "tokenizer.json").exists():
        theirs = WhisperTokenizer.from_dir(tokenizer_dir, generation_config(tokenizer_dir), vocab_size)
        if theirs.tokenizer.get_vocab(with_added_tokens=True) != target.tokenizer.tokenizer.get_vocab(with_added_tokens=True):
            problems.append("tokenizer differs from the target's")
    if width is not None and width != target.config.d_model:
        problems.append(f"cross-attention input width (d_model) {width} != target encoder's {target.config.d_model}")
    if n_mels is not None and n_mels != target.n_mels:
        problems.append(f"mel bins {n_mels} != target's {target.n_mels}")
    if problems:
        raise ModelError(f"draft {name} does not fit target {target.name}: " + "; ".join(problems))


SHIPPED_DRAFTS = Path(__file__).resolve().parents[1] / "drafts"


def default_draft(target_spec: str) -> str | None:
    """The draft shipped for a target (the embedded whisper-base has one), or None."""
    if is_embedded(target_spec) and (SHIPPED_DRAFTS / EMBEDDED / DRAFT_META).exists():
        return str(SHIPPED_DRAFTS / EMBEDDED)
    return None


@dataclass(frozen=True)
class ModelOptions:
    """Which models to load and how: what every command (transcribe, serve, mic, eval, distill, --ray workers)
    passes to :func:`load`. ``draft``: ``auto`` is the one shipped for the target (none for most), None no draft,
    anything else ``load_draft``'s spec. ``compute_type``: CTranslate2's names (``models/compute.py``).
    ``speculation``: ``auto`` drafts only at the batch widths where drafting was measured to pay here (a guess until
    measured: ``auto.guessed_widths``), ``on`` at every width. ``measure_now``: what is not measured on this machine
    yet (``auto``'s type) is measured before loading; False: the guess now (``asr_spec.measure`` measures it, in the
    background, for later processes)."""

    model: str = EMBEDDED
    draft: str | None = "auto"
    device: str = "cpu"
    compute_type: str = "float32"
    threads: int = 0  # torch CPU threads (0: torch's choice)
    speculation: str = "auto"
    measure_now: bool = True

    def precision(self) -> Precision:
        """The compute type resolved for the device (a type it cannot run raises ModelError); ``auto``: the type
        measured fastest here for this model and its shipped draft (``models/auto.py``), or its guess."""
        from .compute import ComputeTypeError

        try:
            p = resolve_compute_type(self.compute_type, self.device, auto=self._auto_type)
        except ComputeTypeError as e:
            raise ModelError(str(e)) from None
        return replace(p, guessed=True) if self.compute_type == "auto" and self.kept_type() is None else p

    def auto_key(self) -> str:
        return f"{Path(self.model).resolve() if Path(self.model).is_dir() else self.model} on {machine(self.device)}"

    def kept_type(self) -> str | None:
        """``auto``'s type as measured on this machine (None: not measured yet)."""
        return auto.kept_type(self.auto_key(), auto.native_types(self.device), cache_dir())

    def widths_key(self, precision: str) -> str:
        """What a draft's widths measurement holds for: target, draft, type and machine (its thread count too)."""
        draft = default_draft(self.model) if self.draft == "auto" else self.draft
        draft = str(Path(draft).resolve()) if draft and Path(draft).is_dir() else draft
        return f"{self.auto_key()} {draft} {precision}"

    def draft_widths(self, precision: str) -> auto.DraftWidths:
        """Where drafting pays for these models at ``precision`` on this machine: measured, else guessed."""
        if self.speculation == "on":
            return auto.ALWAYS
        return auto.kept_widths(self.widths_key(precision), cache_dir()) or auto.guessed_widths(self.device)

    def _auto_type(self) -> str:
        if self.threads:
            torch.set_num_threads(self.threads)
        if (kept := self.kept_type()) is not None:
            return kept
        return self.measure_type() if self.measure_now else auto.guessed_type(self.device)

    def measure_type(self, before_each: Callable[[], None] = lambda: None) -> str:
        """``auto``'s type measured here now (each native type loaded and timed; ``before_each`` runs before each
        type's measurement), kept in the cache directory."""
        draft = default_draft(self.model)

        def measure(name: str) -> float:
            before_each()
            target = load_target(self.model, self.device, name)
            d = load_draft(draft, target) if draft else None
            return auto.window_seconds(target.encode, target.n_mels, target.decoder, d.decoder if d else None)

        return auto.measured_type(self.auto_key(), auto.native_types(self.device), measure, cache_dir())


def load(options: ModelOptions) -> tuple[Whisper, Draft | None]:
    """The target and its draft (or None), both at the options' compute type, the draft with where it pays
    (``ModelOptions.draft_widths``); sets torch's thread count."""
    if options.threads:
        torch.set_num_threads(options.threads)
    target = load_target(options.model, options.device, options.precision())
    spec = default_draft(options.model) if options.draft == "auto" else options.draft
    if spec is None:
        return target, None
    draft = load_draft(spec, target)
    return target, replace(draft, widths=options.draft_widths(target.precision.name))


def load_draft(spec: str, target: Whisper, int8: bool | None = None) -> Draft:
    """``layers:0,5`` (a truncated copy of the target), a decoder-only ``WhisperForCausalLM`` (shared
    encoder; distil-Whisper and ``asr_spec distill`` output) or a full smaller Whisper (own encoder), in the
    target's float type. ``int8``: the draft decoder's linear layers in int8 with one activation scale per call
    (None: on a CPU with int8 kernels, at every compute type: measured fastest there). A draft's precision
    changes only how often it is accepted, never the text."""
    from .compute import int8_kernels

    device, dtype = target.decoder.device, target.net.dtype
    if int8 is None:
        int8 = device.type == "cpu" and int8_kernels(device)
    quant = "tensor" if int8 else None
    # an int8 draft on a CPU computes in float32 whatever the target's float: its int8 layers convert to float32
    # anyway, and bfloat16 attention over one query takes a slow path (draft step at int8_bfloat16: 0.92 ms in
    # bfloat16, 0.62 in float32; AMD EPYC, 2 threads)
    compute = torch.float32 if int8 and device.type == "cpu" else dtype
    # an int8 draft's steps on a CPU as traced graphs (traced_step.py); on CUDA the static
    # decode's graphs replay them
    decoder = lambda net, head, ids=None, rest_ids=None: CachedDecoder(net, head, ids, int8=quant,  # noqa: E731
                                                                       dtype=compute, rest_ids=rest_ids,
                                                                       traced=device.type == "cpu")
    if spec.startswith("layers:"):
        layers = [int(i) for i in spec.split(":", 1)[1].split(",") if i.strip()]
        net = truncated_draft(target, layers)
        return Draft(decoder(net.model.decoder, net.proj_out.weight), None, spec, net)
    path = resolve(spec)
    if (path / DRAFT_META).exists():
        return load_distilled(path, target, decoder)
    try:
        net = load_network(path, dtype, device)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"draft {spec}: not a Whisper model ({type(e).__name__}: {e})") from None
    config = net.config
    if not net.has_encoder:  # a decoder alone (distil-Whisper's WhisperForCausalLM): reads the target's encoder
        _check(target, spec, config.vocab_size, path, config.d_model, None)
        return Draft(decoder(net.model.decoder, net.proj_out.weight), None, spec, net)
    _check(target, spec, config.vocab_size, path, None, config.num_mel_bins)
    return Draft(decoder(net.model.decoder, net.proj_out.weight),
                 AnyLengthEncoder(net.model.encoder, target.precision.int8), spec, net)


def save_distilled(path: Path, decoder: nn.Module, head: torch.Tensor, head_ids: list[int] | None, meta: dict) -> None:
    """Write the ``asr_spec distill`` draft format: the draft's own decoder layers, final layer norm and output
    layer (``draft.safetensors``) plus ``asr_spec_draft.json``. Token and position embeddings are the target's."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    tensors = {f"layers.{k}": v for k, v in decoder.layers.state_dict().items()}
    tensors |= {f"layer_norm.{k}": v for k, v in decoder.layer_norm.state_dict().items()}
    tensors["head.weight"] = head
    # each file replaced whole (a draft is rewritten at every checkpoint while it trains, and may be read meanwhile)
    weights, doc = path / f".draft.{os.getpid()}.part", path / f".{DRAFT_META}.{os.getpid()}.part"
    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in tensors.items()}, str(weights))
    doc.write_text(json.dumps({"format": "asr_spec-draft/1", "decoder_layers": len(decoder.layers),
                               "head_ids": head_ids, **meta, "weights_sha256": sha256(weights)}, indent=1))
    weights.replace(path / "draft.safetensors")
    doc.replace(path / DRAFT_META)


def distilled_decoder(target: Whisper, layers: int) -> Network:
    """A draft network in the target's shape with ``layers`` decoder layers, sharing the target's embeddings. Its
    layers and final norm are new (the caller loads them)."""
    config = target.config.with_decoder_layers(layers)
    draft = Network(config, encoder=False, device="meta")
    src, dst = target.net.model.decoder, draft.model.decoder
    dst.embed_tokens = src.embed_tokens
    dst.embed_positions = src.embed_positions
    draft.proj_out.weight = src.embed_tokens.weight
    device = target.decoder.device
    dst.layers = nn.ModuleList(DecoderLayer(config, device) for _ in range(layers))
    dst.layer_norm = nn.LayerNorm(config.d_model, device=device)
    return draft.to(src.embed_tokens.weight.dtype)


def load_distilled(path: Path, target: Whisper,
                   decoder: Callable[..., CachedDecoder] = CachedDecoder) -> Draft:
    """A draft saved by ``asr_spec distill`` (``decoder``: how its :class:`CachedDecoder` is built)."""
    from safetensors.torch import load_file

    meta = _readable(str(path), path, DRAFT_META, lambda: dict(json.loads((path / DRAFT_META).read_text())))
    if meta.get("format") != "asr_spec-draft/1":
        raise ModelError(f"{path}: unknown draft format {meta.get('format')!r}")
    weights = path / "draft.safetensors"
    # the digest written with the weights (drafts saved before it was kept have none)
    if (digest := meta.get("weights_sha256")) and _readable(str(path), path, weights.name, lambda: sha256(weights)) \
            != digest:
        raise ModelError(f"{weights}: damaged (its bytes are not those saved with {DRAFT_META}); "
                         + ("reinstall asr_spec" if SHIPPED_DRAFTS in path.parents else "copy the draft again"))
    tensors = _readable(str(path), path, weights.name, lambda: load_file(str(weights), device=str(target.decoder.device)))
    head = tensors.pop("head.weight")
    vocab = meta.get("vocab_size", target.config.vocab_size)
    _check(target, str(path), vocab, None, head.shape[1], None)
    draft = distilled_decoder(target, meta["decoder_layers"])
    dec = draft.model.decoder
    dec.layers.load_state_dict({k[7:]: v for k, v in tensors.items() if k.startswith("layers.")})
    dec.layer_norm.load_state_dict({k[11:]: v for k, v in tensors.items() if k.startswith("layer_norm.")})
    draft = draft.to(target.net.dtype).eval().requires_grad_(False)  # stored in fp16, run in the target's precision
    ids = meta.get("head_ids")
    head_ids = torch.tensor(ids, device=target.decoder.device) if ids else None
    head = head.to(target.net.dtype)
    # the whole-vocabulary view (for peers such as assisted generation) gets the trained rows in a full-vocabulary
    # output layer; rows outside the shortlist are zero (logit 0) since a linear layer cannot say -inf
    full = head if head_ids is None else head.new_zeros(vocab, head.shape[1]).index_copy_(0, head_ids, head)
    draft.proj_out.weight = nn.Parameter(full, requires_grad=False)
    # the words outside the shortlist are scored on CUDA only: on a CPU their product (~40,000 rows, 0.9-1.8 ms a
    # draft step at int8) cost what the passes it saved gain (AVX2 EPYC, float32: 2.4 % fewer target passes, decode
    # 2-3 % slower at batch 1 and 8); in a CUDA graph it is one small
    # product
    rest = outside(target, head_ids) if target.decoder.device.type == "cuda" else None
    return Draft(decoder(dec, head, head_ids, rest_ids=rest), None, str(path), draft)


def outside(target: Whisper, head_ids: torch.Tensor | None) -> torch.Tensor | None:
    """The text tokens Whisper may say (not suppressed) that a draft's shortlist ``head_ids`` lacks (None: no
    shortlist): what the draft scores with the target's output layer where its shortlist is unsure
    (``CachedDecoder.rest``)."""
    if head_ids is None:
        return None
    eot = target.vocab.eot
    keep = torch.ones(eot, dtype=torch.bool)
    keep[head_ids[head_ids < eot].cpu()] = False
    keep[[t for t in target.vocab.suppress if t < eot]] = False
    return keep.nonzero()[:, 0].to(head_ids.device)
