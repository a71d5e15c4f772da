"""What the benchmarks in eval/ and the tests share that users of the package never run: the streaming
benchmarks' measurements and clients (``streaming``) and the tiny random Whisper (``tiny``). Scripts in eval/ import it as
``benchkit`` (their folder is on ``sys.path``); the tests through pytest's ``pythonpath``."""
