"""``asr_spec distill``: train a cheap draft decoder for any Whisper target from unlabeled audio and text."""

LABEL_BATCH = 8  # clips the target labels at once by default (a GPU takes more)
