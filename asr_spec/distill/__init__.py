"""``asr_spec distill``: train a cheap draft decoder for any Whisper target from unlabeled audio and text."""
