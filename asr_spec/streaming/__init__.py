"""Streaming transcription: a growing buffer re-decoded as audio arrives (stream.py: one stream; engine.py: all)."""

from .policy import POLICIES  # noqa: F401 - what a re-decode commits, by name (policy.py); the first: the default

STEP_S = 0.5  # a stream is re-decoded after this much new audio ...
MAX_STEP_S = 3.0  # ... or, on a loaded server, up to this much (serve --max-step; engine.py)
