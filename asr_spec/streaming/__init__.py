"""Streaming transcription: a growing buffer re-decoded as audio arrives (see stream.py, engine.py)."""

POLICIES = ("local-agreement", "alignatt")  # what a re-decode commits (stream.py); the first is the default
