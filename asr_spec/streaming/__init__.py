"""Streaming transcription: a growing buffer re-decoded as audio arrives (see stream.py, engine.py)."""
