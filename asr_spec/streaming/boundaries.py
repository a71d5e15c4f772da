"""Where a commit may end in a stream's tokens: at word boundaries (what both commit policies cut at, policy.py)."""
from __future__ import annotations

from ..alignment import APPEND


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
