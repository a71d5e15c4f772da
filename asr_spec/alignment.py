"""Word-level timestamps, Whisper's way: the target decoder reads a window's final text tokens once more, the
cross-attention scores of its alignment heads over the audio frames are normalised and median-filtered, and
dynamic time warping maps tokens to frames; tokens are grouped into words, punctuation joins its neighbour.
Computed once per window for the tokens already decoded, so it never touches the speculative loop."""
from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .models.kv_decoder import CrossKV
from .models.loader import Whisper

FRAMES_PER_SECOND = 50  # encoder output frames
MEDIAN_WIDTH = 7
PREPEND = "\"'“¿([{-"
APPEND = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END = ".。!！?？"
NO_SPACE_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}


@dataclass
class Word:
    word: str  # with its leading space, as decoded
    start: float
    end: float
    probability: float
    tokens: int = 0  # how many of the window's text tokens it holds (punctuation merged in included)

    def as_dict(self) -> dict:
        """As the json output, the API's verbose_json and streaming finals carry it."""
        return {"word": self.word.strip(), "start": self.start, "end": self.end, "probability": round(self.probability, 4)}


def alignment_heads(model: Whisper) -> list[tuple[int, int]]:
    """(layer, head) pairs whose cross-attention follows the speech: the model's own list (generation config),
    else every head of the decoder's second half (openai/whisper's default)."""
    heads = getattr(model.hf.generation_config, "alignment_heads", None)
    if heads:
        return [(int(layer), int(head)) for layer, head in heads]
    cfg = model.hf.config
    return [(layer, head) for layer in range(cfg.decoder_layers // 2, cfg.decoder_layers)
            for head in range(cfg.decoder_attention_heads)]


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monotonic path through ``cost`` [N, M] (diagonal, down or right steps) of least total cost, as
    (row indices, column indices). Rows are filled with a prefix minimum instead of a per-cell loop."""
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)
    total[0, 0] = 0.0
    for i in range(1, n + 1):
        x = cost[i - 1].astype(np.float64)
        # total[i, j] = x[j] + min(total[i-1, j-1], total[i-1, j], total[i, j-1]), unrolled over j:
        # total[i, j] = P[j] + min over k <= j of (u[k] - P[k-1]), P the running sum of x
        u = np.minimum(total[i - 1, :-1], total[i - 1, 1:])
        running = np.cumsum(x)
        before = np.concatenate(([0.0], running[:-1]))
        total[i, 1:] = running + np.minimum.accumulate(u - before)
    i, j = n, m
    rows, cols = [], []
    while i > 0 and j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        diag, up, left = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
        if diag <= up and diag <= left:
            i, j = i - 1, j - 1
        elif up <= left:
            i -= 1
        else:
            j -= 1
    return np.array(rows[::-1]), np.array(cols[::-1])


def _median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window along the last axis (reflect padding), as Whisper filters the scores."""
    if x.shape[-1] <= width // 2:
        return x
    pad = width // 2
    padded = F.pad(x, (pad, pad), mode="reflect")  # x: [heads, tokens, frames]
    return padded.unfold(-1, width, 1).median(-1).values


def _split_words(model: Whisper, tokens: list[int], language: str | None) -> list[tuple[str, list[int]]]:
    """Text tokens -> (word, its tokens): first at whole characters (a token may end inside a UTF-8 character),
    then, for languages written with spaces, joined into words that start with a space or are punctuation."""
    decode = model.tokenizer.decode
    full = decode(tokens)
    pieces: list[tuple[str, list[int]]] = []
    current: list[int] = []
    offset = 0
    for token in tokens:
        current.append(token)
        text = decode(current)
        if "\ufffd" not in text or full[offset + text.index("\ufffd")] == "\ufffd":
            pieces.append((text, current))
            current, offset = [], offset + len(text)
    if language in NO_SPACE_LANGUAGES:
        return pieces
    words: list[tuple[str, list[int]]] = []
    for text, toks in pieces:
        if not words or text.startswith(" ") or text.strip() in string.punctuation:
            words.append((text, list(toks)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + toks)
    return words


def _merge_punctuation(words: list[Word]) -> None:
    """Opening punctuation joins the word after it, closing punctuation the word before it (its time is the
    word's); the emptied entries keep no text and no tokens but stay in place."""
    j = len(words) - 1
    for i in range(len(words) - 2, -1, -1):
        before, after = words[i], words[j]
        if before.word.startswith(" ") and before.word.strip() and before.word.strip() in PREPEND:
            after.word, after.tokens = before.word + after.word, before.tokens + after.tokens
            before.word, before.tokens = "", 0
        else:
            j = i
    i = 0
    for j in range(1, len(words)):
        before, after = words[i], words[j]
        if not before.word.endswith(" ") and after.word in APPEND:
            before.word, before.tokens = before.word + after.word, before.tokens + after.tokens
            after.word, after.tokens = "", 0
        else:
            i = j


@torch.inference_mode()
def align(model: Whisper, memory: torch.Tensor, frames: int, language: str | None, task: str,
          segments: list[list[int]], cross: CrossKV | None = None) -> list[list[Word]]:
    """Words with times (seconds from the window's start) for each segment's tokens of one window.
    ``memory``: the window's encoder output [1, S, D]; ``frames``: the window's audio in mel frames; ``cross``:
    the target's cross-attention keys and values of ``memory`` if the decode kept them (saves computing them)."""
    v = model.vocab
    per_segment = [[t for t in seg if t < v.eot] for seg in segments]
    text = [t for seg in per_segment for t in seg]
    if not text:
        return [[] for _ in segments]
    prefix = [*v.sot_sequence(language if v.multilingual else None, task), v.no_timestamps]
    tokens = torch.tensor([prefix + text + [v.eot]], device=memory.device)
    dec = model.decoder
    heads = alignment_heads(model)
    scores: dict[int, torch.Tensor | None] = {layer: None for layer, _ in heads}
    cache = dec.new_cache(memory, tokens.shape[1], cross=cross)
    logits = dec(cache, tokens, torch.arange(tokens.shape[1], device=memory.device)[None], cross_scores=scores)[0]
    probs = logits[len(prefix) - 1:len(prefix) - 1 + len(text), :v.eot].float().softmax(-1)
    token_probs = probs[torch.arange(len(text)), torch.tensor(text)].cpu().numpy()
    n_frames = max(1, min(frames // 2, memory.shape[1]))
    w = torch.stack([scores[layer][0, head, :, :n_frames] for layer, head in heads]).float().softmax(-1)
    std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)
    w = _median_filter((w - mean) / std.clamp(min=1e-10), MEDIAN_WIDTH)
    matrix = w.mean(0)[len(prefix) - 1:-1]  # rows: the no-timestamps token's successors, i.e. text tokens + eot
    rows, cols = dtw(-matrix.cpu().double().numpy())
    jumps = np.diff(rows, prepend=-1).astype(bool)
    times = cols[jumps] / FRAMES_PER_SECOND  # the frame where each token's row begins
    split = _split_words(model, text, language)
    bounds = np.concatenate(([0], np.cumsum([len(toks) for _, toks in split])))
    words = [Word(text_, float(times[a]), float(times[b]) if b < len(times) else float(times[-1]),
                  float(token_probs[a:b].mean()), b - a)
             for (text_, _), a, b in zip(split, bounds[:-1], bounds[1:])]
    _trim_long_words(words)
    _merge_punctuation(words)
    out: list[list[Word]] = []
    k = 0
    for seg in per_segment:
        taken, mine = 0, []
        while k < len(words) and taken < len(seg):
            taken += words[k].tokens
            if words[k].word:
                mine.append(words[k])
            k += 1
        out.append(mine)
    return out


def _trim_long_words(words: list[Word]) -> None:
    """Whisper's guard against a word absorbing a pause: at a sentence end, a word longer than twice the median
    word duration (at most 0.7 s) is cut to that."""
    durations = np.array([w.end - w.start for w in words])
    durations = durations[durations.nonzero()]
    if not len(durations):
        return
    longest = 2 * min(0.7, float(np.median(durations)))
    for before, w in zip(words, words[1:]):
        if w.end - w.start > longest:
            if w.word.strip() in SENTENCE_END:
                w.end = w.start + longest
            elif before.word.strip() in SENTENCE_END:
                w.start = w.end - longest
