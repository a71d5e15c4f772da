"""The distillation run: label data with the target (cached), choose the draft's token shortlist, train the
draft's layers with knowledge distillation (KL on the target's top-k + CE on its greedy labels), checkpoint,
export. Recipe after distil-Whisper: layers initialised from the target's, frozen shared encoder/embeddings."""
from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tqdm import tqdm

from ..audio import SAMPLE_RATE
from ..models.loader import DRAFT_META, Whisper, distilled_decoder, load_target, save_distilled
from ..writers import write_atomic
from . import LABEL_BATCH
from .data import (
    Clip,
    Example,
    audio_files,
    augmented,
    clips,
    label,
    label_sessions,
    sessions,
    shard_examples,
    synthesize,
)
from .deepen import deepened
from .onpolicy import on_policy
from .shortlist import choose_shortlist, widened
from .tts import available_engines, festival_voices


@dataclass(frozen=True)
class DistillOptions:
    target: str
    out: Path
    work: Path | None = None  # label cache and checkpoints (default: out/work)
    audio: tuple[Path, ...] = ()
    text: tuple[Path, ...] = ()
    layers: tuple[int, ...] = ()  # target layers to start from; default: first and last
    head_size: int = 4000  # text tokens in the draft's output layer (0: full vocabulary)
    tts_clips: int = 600
    real_clips: int = 0  # label only the first N real clips one by one (0: all; the recordings use every clip)
    tts_engines: tuple[str, ...] = ()  # default: every engine installed
    tts_audio: Path | None = None  # clips synthesized elsewhere (a machine without the engines): the first tts_clips
    notimestamps_every: int = 4  # also label every Nth clip in <|notimestamps|> mode
    session_s: float = 120.0  # also join real clips into recordings this long, labelled window by window as
    # ``transcribe`` decodes them (previous text as prompt, timestamps, seeking); 0: off
    init: Path | None = None  # continue from this draft (its layers, output layer and shortlist)
    minutes: float = 20.0  # training time budget (labelling not included)
    max_steps: int = 0  # 0: until the time budget ends
    batch: int = 16
    lr: float = 7e-4
    top_k: int = 32
    ce_weight: float = 0.8
    seed: int = 0
    eval_every: int = 50
    label_batch: int = LABEL_BATCH
    compute_type: str = "float32"  # the target that labels the audio runs at this type (training is float32)
    window_padding: str = "audio"  # how the labelling target pads a window shorter than 30 s (features.WindowPadding)
    device: str = "cpu"  # where the target labels and the draft trains (cuda: a GPU does hours of CPU work)
    augment: int = 0  # augmented copies of every real clip (augment.py), labelled by the target
    on_policy: float = 0.0  # share of each batch made on the draft's own paths (onpolicy.py), labelled by the target
    policy_steps: int = 8  # draft tokens per on-policy example


@dataclass
class State:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)


RUN_FIELDS = ("steps", "train_seconds", "held_aside_acceptance")


# options that say how long and where a run trains, not what: a rerun that changes them resumes the checkpoint
BUDGET = ("out", "minutes", "max_steps", "eval_every")


def same_training(saved: dict, options: dict) -> bool:
    """Whether a checkpoint written with ``saved`` options continues a run with ``options``."""
    strip = lambda d: {k: v for k, v in d.items() if k not in BUDGET}  # noqa: E731
    return strip(saved) == strip(options)


def earlier_runs(init: Path | None) -> list[dict]:
    """The training runs behind the draft ``init``, oldest first, as its metadata records them (the runs behind it,
    then its own): a draft trained in several continued runs reports its whole training time. A draft written before
    this was recorded lists only its own run."""
    if init is None:
        return []
    training = json.loads((init / DRAFT_META).read_text()).get("training", {})
    own = {k: training[k] for k in RUN_FIELDS if k in training} | {"draft": str(init)}
    return [*training.get("earlier_runs", []), own]


def workdir(o: DistillOptions) -> Path:
    return o.work or o.out / "work"


def _log(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)


def cache_name(o: DistillOptions) -> str:
    """The label cache's folder: its shards are numbered by label batch, so another type or batch size labels into a
    folder of its own."""
    name = "cache"
    if o.compute_type != "float32":
        name += f"-{o.compute_type}"
    if o.label_batch != LABEL_BATCH:
        name += f"-b{o.label_batch}"
    if o.window_padding != "audio":
        name += f"-{o.window_padding}"
    return name


def build_data(o: DistillOptions, target: Whisper) -> tuple[list[Example], dict[str, float]]:
    """Label every clip once; shards in out/cache make a rerun resume where it stopped. Returns the examples and the
    hours of audio behind them by kind (``session``: the real clips again, joined into recordings)."""
    cache = workdir(o) / cache_name(o)
    cache.mkdir(parents=True, exist_ok=True)
    sources: list[tuple[str, list[Path]]] = [("real", audio_files(list(o.audio)))]
    if o.tts_audio is not None:
        sources.append(("tts", audio_files([o.tts_audio])[: o.tts_clips or None]))
    elif o.text and o.tts_clips:
        engines = list(o.tts_engines) or available_engines()
        if not engines:
            raise RuntimeError("no TTS engine found (apt-get install espeak-ng flite festival), or pass --tts-clips 0")
        voices = f" (festival: {', '.join(festival_voices())})" if "festival" in engines else ""
        _log(f"synthesizing {o.tts_clips} clips with {', '.join(engines)}{voices}")
        sources.append(("tts", synthesize(list(o.text), o.tts_clips, cache / "tts", engines, o.seed)))
    examples: list[Example] = []
    hours: dict[str, float] = {}
    if o.session_s and sources[0][1]:
        recordings = sessions(sources[0][1], o.session_s)
        hours["session"] = sum(len(a) for _, a in recordings) / SAMPLE_RATE / 3600
        bar = tqdm(total=len(recordings), desc="labelling recordings window by window", unit="recording")
        for n, start in enumerate(range(0, len(recordings), o.label_batch)):
            shard = cache / f"session-{n:05d}.pt"
            part = recordings[start:start + o.label_batch]
            if not shard.exists():
                torch.save(label_sessions(target, part, o.top_k, o.label_batch, o.window_padding),
                           shard.with_suffix(".tmp"))
                shard.with_suffix(".tmp").replace(shard)
            examples += torch.load(shard, weights_only=False)
            bar.update(len(part))
        bar.close()
    if o.real_clips:  # the first N (sorted): a later run with more extends the same shards
        sources[0] = ("real", sources[0][1][:o.real_clips])
    labelled = [(source, list(clips(files, source))) for source, files in sources]
    if o.augment and labelled[0][1]:  # copies of the real clips, changed (augment.py): shards of their own
        labelled.append(("aug", augmented(labelled[0][1], o.augment, o.seed)))
    for source, items in labelled:
        hours[source] = sum(len(a) for _, _, a in items) / SAMPLE_RATE / 3600
        bar = tqdm(total=len(items), desc=f"labelling {source} clips with the target", unit="clip")
        for n, start in enumerate(range(0, len(items), o.label_batch)):
            shard = cache / f"{source}-{n:05d}.pt"
            batch = items[start:start + o.label_batch]
            examples += shard_examples(shard, batch, lambda todo, at=start: _label_clips(target, todo, o, at))
            bar.update(len(batch))
        bar.close()
    return examples, {k: round(v, 3) for k, v in hours.items()}


def _label_clips(target: Whisper, todo: list[tuple[int, Clip]], o: DistillOptions, start: int) -> list[Example]:
    """Examples of the clips ``todo`` ((index in their batch, clip)): each with timestamps, every
    ``notimestamps_every``-th (by its place in the source) also without."""
    got = label(target, [b for _, b in todo], o.top_k, timestamps=True, padding=o.window_padding)
    extra = [b for j, b in todo if (start + j) % o.notimestamps_every == 0]
    return got + (label(target, extra, o.top_k, timestamps=False, padding=o.window_padding) if extra else [])


def _jsonable(o: DistillOptions) -> dict:
    return {k: [str(p) for p in v] if isinstance(v, tuple) and v and isinstance(v[0], Path) else
            (str(v) if isinstance(v, Path) else v) for k, v in asdict(o).items()}


class Batcher:
    """Pads examples into teacher-forcing batches."""

    def __init__(self, head_ids: list[int] | None, vocab_size: int, pad: int, device: str = "cpu"):
        self.pad, self.device = pad, torch.device(device)
        self.index = torch.full((vocab_size,), -1, dtype=torch.long)  # vocab id -> head row (-1: not in head)
        ids = torch.tensor(head_ids) if head_ids else torch.arange(vocab_size)
        self.index[ids] = torch.arange(len(ids))

    def __call__(self, batch: list[Example]):
        inputs = [ex.prompt + (ex.labels[:-1] if ex.inputs is None else ex.inputs) for ex in batch]
        length = max(map(len, inputs))
        x = torch.full((len(batch), length), self.pad, dtype=torch.long)
        y = torch.full((len(batch), length), -100, dtype=torch.long)
        k = batch[0].top_ids.shape[1]
        top_rows = torch.full((len(batch), length, k), -1, dtype=torch.long)
        top_lp = torch.zeros(len(batch), length, k)
        for i, (ex, inp) in enumerate(zip(batch, inputs)):
            x[i, : len(inp)] = torch.tensor(inp)
            at = slice(len(ex.prompt) - 1, len(ex.prompt) - 1 + len(ex.labels))
            y[i, at] = self.index[torch.tensor(ex.labels)]
            top_rows[i, at] = self.index[ex.top_ids.long()]
            top_lp[i, at] = ex.top_logprobs.float()
        y[y < 0] = -100  # labels outside the shortlist cannot be learnt
        memory = torch.stack([ex.memory for ex in batch]).float()
        return tuple(t.to(self.device) for t in (x, y, top_rows, top_lp, memory))


def losses(logits: torch.Tensor, y: torch.Tensor, top_rows: torch.Tensor, top_lp: torch.Tensor):
    """KL(target top-k, renormalised on the shortlist || draft) and CE on the target's greedy labels."""
    valid = y != -100
    ce = F.cross_entropy(logits[valid], y[valid])
    logq = torch.log_softmax(logits, dim=-1)
    in_head = top_rows >= 0
    p = torch.softmax(top_lp.masked_fill(~in_head, float("-inf")), dim=-1)
    p = torch.nan_to_num(p)  # a position whose top-k all fall outside the head
    logq_top = logq.gather(-1, top_rows.clamp(min=0))
    kl = (p * (torch.log(p.clamp(min=1e-12)) - logq_top)).masked_fill(~in_head, 0).sum(-1)
    kl = kl[(top_rows[..., 0] >= 0) | valid].mean()
    return kl, ce


def held_aside_acceptance(model, head: torch.Tensor, batcher: Batcher, held: list[Example]) -> float:
    """Teacher-forced agreement of the draft's argmax with the target's greedy token (per-token acceptance)."""
    hits = total = 0
    with torch.no_grad():
        for i in range(0, len(held), 16):
            x, y, _, _, mem = batcher(held[i:i + 16])
            h = model.model.decoder(x, mem)
            pred = (h @ head.T).argmax(-1)
            labelled = torch.zeros_like(y, dtype=torch.bool)
            for j, ex in enumerate(held[i:i + 16]):
                labelled[j, len(ex.prompt) - 1: len(ex.prompt) - 1 + len(ex.labels)] = True
            hits += int(((pred == y) & labelled).sum())
            total += int(labelled.sum())
    return hits / max(total, 1)


def distill(o: DistillOptions, published: Callable[[dict], None] | None = None) -> dict:
    """Label the data, train the draft, and write it to ``o.out`` at every checkpoint (every ``o.eval_every`` steps)
    and at the end, with its report; ``published(report)`` after each such write (the command writes the card).
    Rerunning with the same data and training options resumes from the work folder's checkpoint, whatever the budget
    (``minutes``, ``max_steps``: a longer one trains on, its learning rate following the new budget)."""
    torch.manual_seed(o.seed)
    rng = random.Random(o.seed)
    target = load_target(o.target, o.device)
    for p in target.net.parameters():
        p.requires_grad_(False)
    t0 = time.perf_counter()
    # labels at the compute type the draft will serve (the draft learns that target's tokens)
    examples, hours = build_data(o, target if o.compute_type == "float32" else
                                 load_target(o.target, o.device, compute_type=o.compute_type))
    label_seconds = time.perf_counter() - t0
    for e in examples:  # every encoder output on the training device once (a GPU holds them), not at every batch
        e.memory = e.memory.to(o.device)
    held = [e for e in examples if e.held_aside] or examples[-1:]  # small runs: hold at least one aside
    train = [e for e in examples if e not in held]
    if not train or not held:
        raise RuntimeError(f"too little data: {len(examples)} labelled examples")
    n_layers = target.config.decoder_layers
    src = target.net.model.decoder
    if o.init is not None:  # fine-tune a draft: its layers, output layer and shortlist
        meta = json.loads((o.init / DRAFT_META).read_text())
        saved = {k: v.float() for k, v in load_file(str(o.init / "draft.safetensors")).items()}
        head_ids, trained = meta["head_ids"], meta["training"]["layers_from"]
        layers = list(o.layers) or trained
        model = distilled_decoder(target, len(layers))
        dec = model.model.decoder
        deepened(dec, src, layers, trained, {k[len("layers."):]: v for k, v in saved.items() if k.startswith("layers.")})
        dec.layer_norm.load_state_dict({k[len("layer_norm."):]: v for k, v in saved.items() if k.startswith("layer_norm.")})
        init_head_tokens, init_layers = (len(head_ids) if head_ids else None), trained
        rows = saved["head.weight"].to(target.decoder.device)
        if o.head_size and head_ids:  # a larger --head-size widens the draft's output layer
            head_ids, rows = widened(target, train, o.text, o.head_size, head_ids, rows)
        head = torch.nn.Parameter(rows.clone())
    else:  # distil-Whisper's recipe: layers copied from the target's, the output layer from its embeddings
        init_head_tokens, init_layers = None, []
        head_ids = choose_shortlist(target, train, o.text, o.head_size)
        layers = list(o.layers) or [0, n_layers - 1]
        model = distilled_decoder(target, len(layers))
        dec = model.model.decoder
        dec.layer_norm.load_state_dict(src.layer_norm.state_dict())
        for j, i in enumerate(layers):
            dec.layers[j].load_state_dict(src.layers[i].state_dict())
        emb = src.embed_tokens.weight.detach()
        head = torch.nn.Parameter((emb[torch.tensor(head_ids)] if head_ids else emb).clone())
    trainable = list(dec.layers.parameters()) + list(dec.layer_norm.parameters()) + [head]
    for p in trainable:
        p.requires_grad_(True)
    model.train()
    opt = torch.optim.AdamW(trainable, lr=o.lr, weight_decay=0.01)
    batcher = Batcher(head_ids, target.vocab.size, target.vocab.eot, o.device)
    state = State()
    ckpt = workdir(o) / "checkpoint.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        if same_training(saved["options"], _jsonable(o)):
            dec.layers.load_state_dict(saved["layers"])
            dec.layer_norm.load_state_dict(saved["layer_norm"])
            head.data.copy_(saved["head"])
            opt.load_state_dict(saved["optimizer"])
            state = State(**saved["state"])
            rng.setstate(saved["rng"])
            _log(f"resumed from step {state.step}")
    coverage = sum(batcher.index[t] >= 0 for e in held for t in e.labels) / sum(len(e.labels) for e in held)
    _log(f"{len(train)} training / {len(held)} held-aside examples (labelling {label_seconds:.0f} s); "
         f"head {len(head_ids) if head_ids else target.vocab.size} tokens, held-aside label coverage {coverage:.1%}")

    def save(acceptance: float) -> dict:
        """The checkpoint, then the draft as it stands and its report (returned)."""
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"options": _jsonable(o), "layers": dec.layers.state_dict(),
                    "layer_norm": dec.layer_norm.state_dict(), "head": head.detach(), "optimizer": opt.state_dict(),
                    "state": asdict(state), "rng": rng.getstate()}, tmp)
        tmp.replace(ckpt)
        report = {
            "target": o.target, "layers_from": layers, "decoder_layers": len(layers),
            "earlier_runs": earlier_runs(o.init), "head_tokens": len(head_ids) if head_ids else target.vocab.size,
            "init_head_tokens": init_head_tokens, "init_layers": init_layers,
            "held_aside_label_coverage": round(float(coverage), 4),
            "examples": {"train": len(train), "held_aside": len(held),
                         **{source: sum(e.source == source for e in examples)
                            for source in ("real", "aug", "tts", "session")}},
            "audio_hours": hours,
            "steps": state.step, "train_seconds": round(state.seconds, 1), "label_seconds": round(label_seconds, 1),
            "held_aside_acceptance": round(acceptance, 4), "history": state.history,
            "options": _jsonable(o),
        }
        training = {k: report[k] for k in ("steps", "train_seconds", "held_aside_acceptance", "layers_from",
                                           "earlier_runs")}
        save_distilled(o.out, dec, head.detach(), head_ids,
                       {"target": o.target, "vocab_size": target.vocab.size, "training": training})
        if published is not None:
            published(report)
        write_atomic(o.out / "report.json", json.dumps(report, indent=1))  # last: the draft is at least this far
        return report

    budget = o.minutes * 60
    total_steps = o.max_steps or None
    bar = tqdm(total=total_steps or int(budget), initial=state.step if total_steps else int(state.seconds),
               desc="training draft", unit="step" if total_steps else "s")
    acceptance = state.history[-1]["acceptance"] if state.history else None
    while (state.step < o.max_steps) if o.max_steps else (state.seconds < budget):
        start = time.perf_counter()
        lr = o.lr * min(1.0, (state.step + 1) / 30)
        if not o.max_steps:
            lr *= max(0.05, 1 - state.seconds / budget)
        else:
            lr *= max(0.05, 1 - state.step / o.max_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = rng.sample(train, min(o.batch, len(train)))
        if (n := round(o.on_policy * len(batch))) > 0:  # part of the batch on the draft's own paths
            model.eval()
            batch = on_policy(model, head.detach(), head_ids, target, batch[:n], o.policy_steps, o.top_k, rng) + \
                batch[n:]
            model.train()
        x, y, top_rows, top_lp, mem = batcher(batch)
        h = dec(x, mem)
        kl, ce = losses(h @ head.T, y, top_rows, top_lp)
        loss = kl + o.ce_weight * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        state.step += 1
        elapsed = time.perf_counter() - start
        state.seconds += elapsed
        if state.step % o.eval_every == 0:
            model.eval()
            acceptance = held_aside_acceptance(model, head, batcher, held)
            model.train()
            state.history.append({"step": state.step, "seconds": round(state.seconds, 1), "loss": round(loss.item(), 4),
                                  "acceptance": round(acceptance, 4)})
            save(acceptance)
        bar.set_postfix(loss=f"{loss.item():.3f}", kl=f"{kl.item():.3f}", ce=f"{ce.item():.3f}",
                        held_acc=f"{acceptance:.3f}" if acceptance is not None else "-")
        bar.update(1 if total_steps else elapsed)
    bar.close()
    model.eval()
    acceptance = held_aside_acceptance(model, head, batcher, held)
    if not state.history or state.history[-1]["step"] != state.step:
        state.history.append({"step": state.step, "seconds": round(state.seconds, 1), "acceptance": round(acceptance, 4)})
    return save(acceptance)
