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

from .models.kv_decoder import CrossKV, length_mask
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
    heads = model.generation.get("alignment_heads")
    if heads:
        return [(int(layer), int(head)) for layer, head in heads]
    cfg = model.config
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
    return padded.unfold(-1, width, 1).sort(-1).values[..., width // 2]  # the median, faster than median()


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


@dataclass(frozen=True)
class Alignment:
    """What :func:`align_many` aligns for one window: its encoder output [1, S, D] (or, in ``cross``, the target's
    cross-attention keys and values of it, which a decode may have kept), its audio in mel frames, and the text
    tokens of its segments (others, such as timestamps, are skipped)."""
    memory: torch.Tensor
    frames: int
    language: str | None
    task: str
    segments: list[list[int]]
    cross: CrossKV | None = None
    scored: int = 0  # the words of segments before this one get no probability (0.0): their output layer is skipped


@torch.inference_mode()
def align(model: Whisper, memory: torch.Tensor, frames: int, language: str | None, task: str,
          segments: list[list[int]], cross: CrossKV | None = None, scored: int = 0) -> list[list[Word]]:
    """Words with times (seconds from the window's start) for each segment's tokens of one window.
    ``memory``: the window's encoder output [1, S, D]; ``frames``: the window's audio in mel frames; ``cross``:
    the target's cross-attention keys and values of ``memory`` if the decode kept them (saves computing them);
    ``scored``: the first segment whose words get probabilities (see :class:`Alignment`)."""
    return align_many(model, [Alignment(memory, frames, language, task, segments, cross, scored)])[0]


@torch.inference_mode()
def align_many(model: Whisper, windows: list[Alignment], width: int | None = None) -> list[list[list[Word]]]:
    """:func:`align` for several windows, their text read in one forward pass of the target decoder (rows padded
    with end-of-text after their own tokens, each attending to its own encoder positions: each memory length on its
    own, or, with ``width``, every row's memory padded to ``width`` positions and attended under a mask in one call
    per layer, as a static decode attends it: a row's numbers then depend on its own length and ``width`` only, and
    the host's work does not grow with the rows' lengths)."""
    v = model.vocab
    out: list[list[list[Word]]] = [[[] for _ in w.segments] for w in windows]
    texts = [[t for seg in w.segments for t in seg if t < v.eot] for w in windows]
    rows = [i for i, text in enumerate(texts) if text]
    if not rows:
        return out
    prefixes = [[*v.sot_sequence(windows[i].language if v.multilingual else None, windows[i].task), v.no_timestamps]
                for i in rows]
    seqs = [p + texts[i] + [v.eot] for p, i in zip(prefixes, rows)]
    dec = model.decoder
    device = windows[rows[0]].memory.device
    tokens = torch.tensor([s + [v.eot] * (max(map(len, seqs)) - len(s)) for s in seqs], device=device)
    lengths = [windows[i].memory.shape[1] for i in rows]
    longest = width or max(lengths)
    fit = lambda t, dim: t if t.shape[dim] == longest else F.pad(t, (0, 0, 0, longest - t.shape[dim]))  # noqa: E731
    memory = torch.cat([fit(windows[i].memory, 1) for i in rows])
    cross = None
    if all(windows[i].cross is not None for i in rows):  # the decodes' own keys and values, padded alike
        pad = lambda ts: torch.cat([fit(t, 2) for t in ts])  # noqa: E731
        cross = CrossKV([pad([windows[i].cross.keys[layer] for i in rows]) for layer in range(len(dec.layers))],
                        [pad([windows[i].cross.values[layer] for i in rows]) for layer in range(len(dec.layers))])
    heads = alignment_heads(model)
    scores: dict[int, list[int] | torch.Tensor] = {}
    for layer, head in heads:
        scores.setdefault(layer, []).append(head)
    at_layer = [scores[layer].index(head) for layer, head in heads]  # each head's place among its layer's
    columns = max(map(len, seqs))
    cache = dec.new_cache(memory, columns, lengths if min(lengths) < longest else None, cross=cross)
    if width is not None and cache.cross_lengths is not None:
        cache.static_mask = length_mask(lengths, longest, device)
    positions = torch.arange(columns, device=device)[None].expand(len(rows), columns)
    # the output layer reads only the positions that predict scored text tokens (the rest of a row repeats its last)
    unscored = [sum(t < v.eot for seg in windows[i].segments[:windows[i].scored] for t in seg) for i in rows]
    scored = [len(texts[i]) - u for i, u in zip(rows, unscored)]
    at = [[len(p) - 1 + u + j for j in range(max(n, 1))] for p, u, n in zip(prefixes, unscored, scored)]
    most = max(map(len, at))
    at = torch.tensor([a + a[-1:] * (most - len(a)) for a in at], device=device)
    logits = dec(cache, tokens, positions, at, cross_scores=scores)
    attention = torch.stack([scores[layer][:, j] for (layer, _), j in zip(heads, at_layer)], 1)  # [rows, heads, T, S]
    for b, (i, prefix, text) in enumerate(zip(rows, prefixes, [texts[i] for i in rows])):
        w = windows[i]
        probs = logits[b, :scored[b], :v.eot].float().softmax(-1)
        token_probs = np.concatenate([np.zeros(unscored[b]), probs[torch.arange(scored[b]),
                                                                    torch.tensor(text[unscored[b]:], dtype=torch.long)].cpu().numpy()])
        n_frames = max(1, min(w.frames // 2, lengths[b]))
        n = len(prefix) + len(text) + 1
        att = attention[b, :, :n, :n_frames].float().softmax(-1)
        out[i] = _words(model, w.segments, w.language, att, len(prefix) - 1, token_probs)
    return out


def decoded_words(model: Whisper, attention: torch.Tensor, tokens: list[int], before: int, frames: int,
                  language: str | None, logprobs: list[float]) -> list[Word]:
    """The words of ``tokens[before:]`` (aligned after ``tokens[:before]``, whose words are dropped) from the
    cross-attention a decode recorded as it chose them (``RowResult.attention``: row j holds the alignment heads'
    scores of the query that chose ``tokens[j]``), instead of a pass of its own. ``logprobs``: the decode's
    log-probabilities of ``tokens[before:]`` (a word's probability is its tokens' mean); ``frames``: mel frames
    of audio."""
    eot = model.vocab.eot
    text = [j for j, t in enumerate(tokens) if t < eot]
    if not any(j >= before for j in text):
        return []
    rows = [j for j in text + [text[-1] + 1] if j < attention.shape[1]]  # + the query after the last text token
    n_frames = max(1, min(frames // 2, attention.shape[2]))
    att = attention[:, rows, :n_frames].float().softmax(-1)
    att = torch.cat([att, att[:, -1:]], 1)  # _words leaves out a last row (the end-of-text input's)
    probs = [0.0 if j < before else float(np.exp(logprobs[j - before])) for j in text]
    segments = [tokens[:before], tokens[before:]]
    return _words(model, segments, language, att, 0, np.array(probs))[1]


def _words(model: Whisper, segments: list[list[int]], language: str | None, att: torch.Tensor, at: int,
           token_probs: np.ndarray) -> list[list[Word]]:
    """Whisper's word timing from the alignment heads' attention ``att`` [heads, tokens, frames] of one window
    (its text tokens start after position ``at``), grouped by ``segments`` (tokens of each; only text counts)."""
    std, mean = torch.std_mean(att, dim=-2, keepdim=True, unbiased=False)
    att = _median_filter((att - mean) / std.clamp(min=1e-10), MEDIAN_WIDTH)
    matrix = att.mean(0)[at:-1]  # rows: the no-timestamps token's successors, i.e. text tokens + eot
    rows, cols = dtw(-matrix.cpu().double().numpy())
    jumps = np.diff(rows, prepend=-1).astype(bool)
    times = cols[jumps] / FRAMES_PER_SECOND  # the frame where each token's row begins
    # words are split and punctuation merged within each segment: a segment's words are exactly its own tokens
    # (a streaming final that starts with "," or "book" after a committed "block" keeps them)
    segments = [[t for t in seg if t < model.vocab.eot] for seg in segments]
    starts = np.cumsum([0] + [len(seg) for seg in segments])
    out: list[list[Word]] = []
    for seg, first in zip(segments, starts):
        split = _split_words(model, seg, language)
        bounds = first + np.concatenate(([0], np.cumsum([len(toks) for _, toks in split]))).astype(int)
        out.append([Word(text_, float(times[a]), float(times[b]) if b < len(times) else float(times[-1]),
                         float(token_probs[a:b].mean()), b - a)
                    for (text_, _), a, b in zip(split, bounds[:-1], bounds[1:])])
    _trim_long_words([word for words in out for word in words])
    for words in out:
        _merge_punctuation(words)
    return [[word for word in words if word.word] for words in out]


# Whisper's measure of a word the audio does not hold (openai/whisper's hallucination_silence_threshold): a word
# aligned shorter than SHORT_S is suspect by how much (15 a second), and by 1 more when the target gave it less than
# UNLIKELY; a run of suspects whose measures add up to ANOMALOUS is a hallucination
SHORT_S, UNLIKELY, ANOMALOUS = 0.133, 0.15, 3.0


def held(words: list[Word]) -> int:
    """How many of ``words`` (aligned, in order) the audio holds: those before the first run of suspect words whose
    measures add up to ``ANOMALOUS``. Whisper hallucinates on what is left of an utterance by saying its last
    sentence again, and the alignment piles the copy's words on one frame."""
    i = 0
    while i < len(words):
        j, score = i, 0.0
        while j < len(words) and (d := words[j].end - words[j].start) < SHORT_S:
            score += 15 * (SHORT_S - d) + (words[j].probability < UNLIKELY)
            j += 1
        if score >= ANOMALOUS:
            return i
        i = j + 1
    return len(words)


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
