"""Voice activity: Silero VAD (the ``silero-vad`` package ships its model) over 32 ms chunks, several streams at once."""
from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np
import torch

from .audio import SAMPLE_RATE, Audio, blocks_of

BLOCK = 64  # chunks in one call of the network's convolutional front (every stream's chunks together)
ROWS = 16  # streams in one step of its recurrent back
# Both fixed: at a fixed shape a row's result depends on nothing but its own input, so a stream's flags are the same
# alone or in company, and however its audio arrived (tests/streaming/test_vad.py).


class _Network:
    """Silero VAD's 16 kHz network (the ``silero-vad`` package ships it), shared by every stream: a convolutional
    front that reads a chunk with its context, and a recurrent back (an LSTM cell and a linear output) written out
    here as matrix products, so that the cell's input products run for many chunks at once and a step is a dozen
    small operations; each stream keeps its own state (:class:`VoiceActivity`)."""

    def __init__(self) -> None:
        from importlib.resources import files

        threads = torch.get_num_threads()
        with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript loading; the model ships as one
            warnings.simplefilter("ignore", DeprecationWarning)
            model = torch.jit.load(str(files("silero_vad") / "data" / "silero_vad.jit"), map_location="cpu").eval()
        torch.set_num_threads(threads)  # loading the model sets torch's thread count to 1
        self.net = model._model
        cell, out = self.net.decoder.rnn, getattr(self.net.decoder.decoder, "2")  # after dropout and ReLU
        self.w_in, self.w_state = cell.weight_ih.T.contiguous(), cell.weight_hh.T.contiguous()
        self.b_cell = cell.bias_ih + cell.bias_hh
        self.w_out, self.b_out = out.weight[0, :, 0].clone(), out.bias.clone()

    def front(self, x: torch.Tensor) -> torch.Tensor:
        """[n, CONTEXT + CHUNK] chunks -> [n, 512]: the cell's input products (gates before the state's part)."""
        return torch.addmm(self.b_cell, self.net.encoder(self.net.run_extractors(x)).squeeze(-1), self.w_in)

    def step(self, gates_in: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One LSTM cell step (torch's gate order: input, forget, cell, output)."""
        i, f, g, o = (gates_in + h @ self.w_state).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def speech_probability(self, h: torch.Tensor) -> torch.Tensor:
        """[..., 128] hidden states -> [...] probabilities of speech. The logits padded to a multiple of 64: torch
        computes the tail of an element-wise operation shorter than its vector loop with scalar code (other bits), so
        a stream's probability would depend on how many steps its company needed."""
        z = ((torch.relu(h) * self.w_out).sum(-1) + self.b_out).reshape(-1)
        return torch.sigmoid(torch.cat([z, z.new_zeros(-len(z) % 64)]))[:len(z)].view(h.shape[:-1])


@lru_cache(maxsize=1)
def _network() -> _Network:
    return _Network()


class VoiceActivity:
    """Speech / non-speech per 512-sample chunk of one stream: the network's recurrent state, the end of the last
    chunk (the next chunk's context) and the samples not yet flagged. :func:`detect` runs several streams together."""

    CHUNK = 512
    CONTEXT = 64  # samples before each chunk that the network reads with it

    def __init__(self, threshold: float = 0.5):
        self.threshold = threshold
        self._rest = np.zeros(0, dtype=np.float32)
        self._context = np.zeros(self.CONTEXT, dtype=np.float32)
        self._state = np.zeros((2, 128), dtype=np.float32)  # the recurrent layer's hidden and cell state

    @property
    def pending(self) -> int:
        """Samples received but not yet flagged (the start of the next chunk)."""
        return len(self._rest)

    def _inputs(self, audio: np.ndarray) -> np.ndarray:
        """The network's inputs for the chunks ``audio`` completes: [n, CONTEXT + CHUNK]; the rest waits."""
        x = np.concatenate([self._rest, np.asarray(audio, dtype=np.float32)])
        n = len(x) // self.CHUNK
        self._rest = x[n * self.CHUNK:]
        if not n:
            return np.zeros((0, self.CONTEXT + self.CHUNK), dtype=np.float32)
        x = np.concatenate([self._context, x[:n * self.CHUNK]])
        self._context = x[-self.CONTEXT:].copy()
        return np.lib.stride_tricks.sliding_window_view(x, self.CONTEXT + self.CHUNK)[::self.CHUNK]

    def __call__(self, audio: np.ndarray) -> list[bool]:
        """Voiced flags of the chunks ``audio`` completes (leftover samples wait for the next call)."""
        return detect([(self, audio)])[0]


def detect(work: list[tuple[VoiceActivity, np.ndarray]]) -> list[list[bool]]:
    """Each stream's voiced flags for the chunks its new audio completes (:func:`probabilities` at its threshold)."""
    return [[p >= vad.threshold for p in probs] for (vad, _), probs in zip(work, probabilities(work))]


@torch.inference_mode()
def probabilities(work: list[tuple[VoiceActivity, np.ndarray]]) -> list[list[float]]:
    """Each stream's speech probabilities for the chunks its new audio completes: every stream's chunks through the
    network's front ``BLOCK`` at a time, then its back a chunk at a time for ``ROWS`` streams together (rows without a
    chunk, or without a stream, keep their state). 64 streams cost a front call per 64 chunks and 4 back steps a
    chunk, where a call of the whole network per chunk and stream cost 64."""
    net, width = _network(), VoiceActivity.CONTEXT + VoiceActivity.CHUNK
    inputs = [vad._inputs(audio) for vad, audio in work]
    counts = [len(x) for x in inputs]
    if not sum(counts):
        return [[] for _ in work]
    flat = torch.from_numpy(np.concatenate([*inputs, np.zeros((-sum(counts) % BLOCK, width), dtype=np.float32)]))
    gates_in = torch.cat([net.front(b) for b in flat.split(BLOCK)])
    firsts = np.cumsum([0, *counts])
    out: list[list[float]] = [[] for _ in work]
    padded = torch.cat([gates_in, gates_in.new_zeros(1, gates_in.shape[1])])  # its last row: a step without a chunk
    for first in range(0, len(work), ROWS):
        rows = range(first, min(first + ROWS, len(work)))
        steps = max(counts[i] for i in rows)
        if not steps:
            continue
        # the rows' inputs and states gathered in one operation each (a row without a chunk, or without a stream, reads
        # the zero row and a zero state), so the host's work per call does not grow with the streams
        at = np.full((steps, ROWS), len(padded) - 1)
        states = np.zeros((ROWS, 2, 128), dtype=np.float32)
        for j, i in enumerate(rows):
            at[:counts[i], j] = np.arange(firsts[i], firsts[i] + counts[i])
            states[j] = work[i][0]._state
        g = padded[torch.from_numpy(at)]
        h, c = torch.from_numpy(states).unbind(1)
        lengths = torch.from_numpy(np.array([counts[i] for i in rows] + [0] * (ROWS - len(rows))))
        live = torch.arange(steps)[:, None, None] < lengths[:, None]  # [steps, ROWS, 1]: the rows with a chunk
        hs = torch.empty(steps, ROWS, 128)
        for n in range(steps):
            hs[n], c_next = net.step(g[n], h, c)
            h, c = torch.where(live[n], hs[n], h), torch.where(live[n], c_next, c)
        probs = net.speech_probability(hs).T.tolist()
        kept = torch.stack([h, c], 1).numpy()
        for j, i in enumerate(rows):
            out[i] = probs[j][:counts[i]]
            work[i][0]._state = kept[j].copy()
    return out


def speech_chunks(audio: Audio, max_s: float = 30.0, pad_s: float = 0.2) -> tuple[list[tuple[int, int]], int]:
    """Sample ranges of at most ``max_s`` that together hold all of ``audio``'s speech (``--chunked``), and the
    audio's length (read once, a block at a time): voiced runs widened by ``pad_s`` on each side, joined with the
    silence between them while the piece stays within ``max_s``; a run longer than that is cut every ``max_s``.
    Audio outside every piece is silence."""
    vad, flags, length = VoiceActivity(), [], 0
    for block in blocks_of(audio):
        flags += vad(block)
        length += len(block)
    step, limit, pad = VoiceActivity.CHUNK, int(max_s * SAMPLE_RATE), int(pad_s * SAMPLE_RATE)
    runs: list[tuple[int, int]] = []
    for i, voiced in enumerate(flags):
        if not voiced:
            continue
        a, b = max(0, i * step - pad), min(length, (i + 1) * step + pad)
        if runs and a <= runs[-1][1]:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((a, b))
    pieces: list[tuple[int, int]] = []
    for a, b in runs:
        while b - a > limit:
            pieces.append((a, a + limit))
            a += limit
        if pieces and b - pieces[-1][0] <= limit:
            pieces[-1] = (pieces[-1][0], b)
        else:
            pieces.append((a, b))
    return pieces, length
