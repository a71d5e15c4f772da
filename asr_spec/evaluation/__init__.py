"""``asr_spec eval``: WER parity, speed-up and memory of our decoders and of peer systems, side by side."""
