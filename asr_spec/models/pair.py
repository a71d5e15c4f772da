"""The target's and the draft's share of one thing: encoder outputs, cross-attention keys and values."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Pair(Generic[T]):
    """``target``'s and ``draft``'s (None: no draft, or not known) of the same thing."""
    target: T
    draft: T | None = None
