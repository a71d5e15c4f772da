"""The ``asr_spec`` commands (asr_spec.cli parses the command line): each command's options as one frozen
dataclass (asr_spec.arguments generates the options from it) and the function that runs the command with it."""
