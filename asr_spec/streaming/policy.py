"""What a re-decode of a stream commits: two policies behind one small interface.

A re-decode's hypothesis is the committed text + a continuation. A policy says how many tokens of the continuation
are final now; the rest is the partial (and the next decode's draft hint). Both cut only at word boundaries
(:class:`Boundaries`).
- :class:`AlignAtt` (SimulStreaming's, after ONE decode): the continuation's words whose audio ends, by the
  cross-attention of the model's alignment heads (Whisper's word alignment), at least ``margin_s`` before the
  decoded audio does; the last word is held back (it may be unfinished); a word the target is unsure of waits
  until ``unsure_margin_s`` of audio follow it, and nothing after it is committed before.
- :class:`LocalAgreement` (whisper_streaming's LocalAgreement-2): the longest common prefix of this continuation
  and the previous one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from ..alignment import APPEND, Word

# the words of a continuation, aligned over the audio it was decoded from (seconds from the buffer's start)
WordsOf = Callable[[], list[Word]]


class Boundaries:
    """Where a commit may end in a token sequence: before a timestamp, a token that starts a word (with its space)
    or other non-alphanumeric text, but not before closing punctuation, which belongs to the word before it (a
    final never starts with ", produced")."""

    def __init__(self, tokenizer):
        self.tokenizer, self.eot = tokenizer, tokenizer.vocab.eot
        self._starts: dict[int, bool] = {}

    def before(self, token: int) -> bool:
        if token >= self.eot:
            return True
        if token not in self._starts:
            piece = self.tokenizer.id_to_token(token) or ""
            self._starts[token] = piece.startswith("Ġ") or not (piece[:1].isalnum() or piece[:1] in APPEND)
        return self._starts[token]

    def back(self, tokens: list[int], n: int) -> int:
        """The largest boundary <= n in ``tokens`` (a cut before the token at n; the end is not one)."""
        while n > 0 and (n >= len(tokens) or not self.before(tokens[n])):
            n -= 1
        return n

    def forward(self, tokens: list[int], n: int) -> int:
        """The smallest boundary >= n in ``tokens``, or its end (a word's last tokens may not be text)."""
        while 0 < n < len(tokens) and not self.before(tokens[n]):
            n += 1
        return n

    def text_tokens(self, tokens: list[int], count: int) -> int:
        """How many tokens of ``tokens`` hold its first ``count`` text tokens (timestamps in between included)."""
        n = 0
        while count > 0 and n < len(tokens):
            count -= tokens[n] < self.eot
            n += 1
        return n


class CommitPolicy(Protocol):
    """Says how many tokens of a re-decode's continuation ``cont`` to commit now. ``previous``: the last
    continuation; ``words``: its words aligned (only AlignAtt asks: :attr:`aligns`); ``heard_s``: seconds of audio
    the decode heard."""
    aligns: bool

    def commit(self, cont: list[int], previous: list[int], words: WordsOf, heard_s: float) -> int: ...


@dataclass(frozen=True)
class AlignAtt:
    boundaries: Boundaries
    margin_s: float = 0.5
    # a word the target gives less than this waits until it ends ``unsure_margin_s`` before the decoded audio: Whisper's
    # early mistakes ("their" for "there") are such words, which more audio after them corrects (dev WER 8.39 % without
    # the rule, 7.53 % at 0.7, 7.18 % at 0.8 or 0.9; offline 6.92 %; docs/how-it-works.md)
    min_probability: float = 0.8
    unsure_margin_s: float = 3.0
    aligns: bool = True

    def commit(self, cont: list[int], previous: list[int], words: WordsOf, heard_s: float) -> int:
        if not any(t < self.boundaries.eot for t in cont):
            return 0
        text_tokens = 0
        for w in words()[:-1]:
            margin = self.margin_s if w.probability >= self.min_probability else self.unsure_margin_s
            if w.end > heard_s - margin:
                break
            text_tokens += w.tokens
        b = self.boundaries
        return b.back(cont, b.text_tokens(cont, text_tokens))


@dataclass(frozen=True)
class LocalAgreement:
    boundaries: Boundaries
    aligns: bool = False

    def commit(self, cont: list[int], previous: list[int], words: WordsOf, heard_s: float) -> int:
        n = 0
        while n < min(len(cont), len(previous)) and cont[n] == previous[n]:
            n += 1
        return self.boundaries.back(cont, n)


def policy_for(name: str, boundaries: Boundaries, margin_s: float, min_probability: float,
               unsure_margin_s: float) -> CommitPolicy:
    """The policy called ``name`` (one of ``POLICIES``)."""
    if name == "alignatt":
        return AlignAtt(boundaries, margin_s, min_probability, unsure_margin_s)
    if name == "local-agreement":
        return LocalAgreement(boundaries)
    raise ValueError(f"unknown commit policy {name!r}")
