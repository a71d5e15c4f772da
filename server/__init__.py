"""``asr_spec serve`` (installed as ``asr_spec.server``): the ASGI app, the native streaming protocol, the
OpenAI-compatible endpoints and the browser page."""
