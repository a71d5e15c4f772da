"""What a re-decode of a stream commits: two policies, each a small frozen value (its parameters) behind one method.

A re-decode's hypothesis is the committed text + a continuation. A policy says how many tokens of the continuation
are final now; the rest is the partial (and the next decode's draft hint). Both cut only at word boundaries
(boundaries.py).
- :class:`AlignAtt` (SimulStreaming's, after ONE decode): the continuation's words whose audio ends, by the
  cross-attention of the model's alignment heads (Whisper's word alignment), at least ``margin_s`` before the
  decoded audio does; the last word is held back (it may be unfinished); a word the target is unsure of waits
  until ``unsure_margin_s`` of audio follow it, and nothing after it is committed before.
- :class:`LocalAgreement` (whisper_streaming's LocalAgreement-2): the longest common prefix of this continuation
  and the previous one.

Policies are chosen by name where users choose them (``serve --commit-policy``, the start message's
``commit_policy``: :func:`policy_named`) and are objects everywhere after that. This module imports nothing heavy:
the command line reads the names from it at every start.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar

if TYPE_CHECKING:
    from ..alignment import Word
    from .boundaries import Boundaries

# the words of a continuation, aligned over the audio it was decoded from (seconds from the buffer's start)
WordsOf = Callable[[], "list[Word]"]


@dataclass(frozen=True)
class AlignAtt:
    """Commits the words the audio already supports and the target is sure of (see the module's text)."""
    name: ClassVar[str] = "alignatt"
    aligns: ClassVar[bool] = True  # its commits read the continuation's words, aligned
    # a longer margin costs latency for no WER: with 0.5 s one speaker's final median was 0.97-1.25 s against
    # 0.81-0.89 s, the same dev WER (a final is checked against the padded window anyway)
    margin_s: float = 0.3
    # a word the target gives less than this waits until it ends ``unsure_margin_s`` before the decoded audio: Whisper's
    # early mistakes ("their" for "there") are such words, which more audio after them corrects (dev WER 8.39 % without
    # the rule, 7.53 % at 0.7, 7.18 % at 0.8 or 0.9; offline 6.92 %)
    min_probability: float = 0.8
    # with 3 s, 4 speakers' final median was 1.45-1.54 s against 1.23-1.34 s (p90 3.43 against 2.50-2.57 s), the same
    # dev WER, long-form 0.53 against 0.71 % off the offline text
    unsure_margin_s: float = 2.0

    def commit(self, b: Boundaries, cont: list[int], previous: list[int], words: WordsOf, heard_s: float) -> int:
        """How many tokens of a re-decode's continuation ``cont`` to commit now, cut at ``b``'s boundaries.
        ``previous``: the last continuation; ``words``: ``cont``'s words aligned; ``heard_s``: seconds of audio the
        decode heard."""
        if not any(t < b.eot for t in cont):
            return 0
        text_tokens = 0
        for w in words()[:-1]:
            margin = self.margin_s if w.probability >= self.min_probability else self.unsure_margin_s
            if w.end > heard_s - margin:
                break
            text_tokens += w.tokens
        return b.back(cont, b.text_tokens(cont, text_tokens))


@dataclass(frozen=True)
class LocalAgreement:
    """Commits what this re-decode and the one before agree on (see the module's text)."""
    name: ClassVar[str] = "local-agreement"
    aligns: ClassVar[bool] = False

    def commit(self, b: Boundaries, cont: list[int], previous: list[int], words: WordsOf, heard_s: float) -> int:
        """As :meth:`AlignAtt.commit`; ``words`` is not read."""
        n = 0
        while n < min(len(cont), len(previous)) and cont[n] == previous[n]:
            n += 1
        return b.back(cont, n)


CommitPolicy = AlignAtt | LocalAgreement
_KINDS: dict[str, type[CommitPolicy]] = {kind.name: kind for kind in (AlignAtt, LocalAgreement)}
POLICIES = tuple(_KINDS)  # the policies' names (serve --commit-policy, the start message); the first: the default


def policy_named(name: str) -> CommitPolicy:
    """The policy called ``name`` (one of ``POLICIES``), with its default parameters."""
    if name not in _KINDS:
        raise ValueError(f"unknown commit policy {name!r}")
    return _KINDS[name]()
