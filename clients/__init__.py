"""Clients of asr_spec serve: file streaming and the live microphone."""
