# asr_spec serve in a container: the package with its embedded model (whisper-base and its draft), run as a non-root
# user, health-checked on /livez (liveness; /health is readiness, 503 while full or draining). CPU by default; CUDA: docker build --build-arg DEVICE=cuda -t asr_spec:cuda .
#   docker build -t asr_spec .
#   docker run -p 8765:8765 -e ASR_SPEC_API_KEY="$(openssl rand -hex 16)" asr_spec [serve options]
#   docker run --gpus all -p 8765:8765 -e ASR_SPEC_API_KEY=... asr_spec:cuda
FROM python:3.11-slim

ARG DEVICE=cpu
# TORCH_SPEC works as in the README's set-up (the torch requirement; default torch==2.13.0)
ARG TORCH_SPEC

RUN useradd --create-home --uid 10001 asr
USER asr
WORKDIR /home/asr/asr_spec
COPY --chown=asr:asr . .

# The README's set-up command, verbatim (tests/server/test_dockerfile.py checks it). On a CPU image torch comes from
# PyTorch's CPU index (PyPI's Linux wheel is the CUDA build); the last step converts the embedded model into
# ~/.cache/asr_spec and transcribes the bundled sample, so the container starts without converting anything. The
# machine is measured (asr_spec/measure.py) where the container runs, not on the build machine: off during the build step.
RUN export ASR_SPEC_MEASURE=off && if [ "$DEVICE" = cpu ]; then export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu; fi && \
    python3 -m venv .venv && . .venv/bin/activate && pip install "${TORCH_SPEC:-torch==2.13.0}" && pip install -e ".[models]" && asr_spec transcribe --sample && \
    rm -rf ~/.cache/pip

ENV PATH=/home/asr/asr_spec/.venv/bin:$PATH ASR_SPEC_PORT=8765 ASR_SPEC_DEVICE=$DEVICE PYTHONUNBUFFERED=1
EXPOSE 8765
HEALTHCHECK --interval=30s --timeout=5s --start-period=90s --retries=3 \
    CMD python -c "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/livez' % os.environ['ASR_SPEC_PORT'], timeout=4)"
# every argument of docker run goes on to asr_spec serve (e.g. --max-sessions 8); SIGTERM drains the sessions
ENTRYPOINT ["sh", "-c", "exec asr_spec serve --host 0.0.0.0 --port \"$ASR_SPEC_PORT\" --device \"$ASR_SPEC_DEVICE\" \"$@\"", "asr_spec"]
