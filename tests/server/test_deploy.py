"""docs/deploy.md's nginx recipe, run as written (ports and file paths filled in) with Debian's nginx in front of two
real servers on loopback (the tiny random model: the routing and the health signals are tested, not the text)."""
from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from asr_spec.server.config import ServerConfig
from conftest import system_tool
from server_proc import free_port, in_process, recv
from websockets.sync.client import connect

from asr_spec.streaming.engine import Engine
from asr_spec.transcribe import Transcriber

DEPLOY = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
RECIPE = re.compile(r"<!-- nginx.conf -->\n```nginx\n(.*?)```\n<!-- /nginx.conf -->", re.S)


def nginx_conf(upstreams: tuple[int, int], port: int, tmp: Path) -> str:
    """The recipe with these ports, run in the foreground as one process with its files in ``tmp``."""
    conf = RECIPE.search(DEPLOY.read_text()).group(1)
    for default, actual in zip(("127.0.0.1:8765", "127.0.0.1:8766"), upstreams):
        assert f"server {default} " in conf
        conf = conf.replace(f"server {default} ", f"server 127.0.0.1:{actual} ")
    assert "listen 8080;" in conf
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    files = " ".join(f"{kind}_temp_path {tmp}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = conf.replace("http {", f"http {{\n    access_log {tmp}/access.log;\n    {files}", 1)
    return f"daemon off;\nmaster_process off;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log;\n{conf}"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except urllib.error.URLError:  # nothing listening yet
        return 0, b""


@pytest.mark.slow
def test_nginx_spreads_sessions_over_two_servers_and_health_says_when_they_are_full(tiny_target, tmp_path):
    nginx = system_tool("nginx", install="sudo apt-get install nginx")
    config = ServerConfig(port=0, max_sessions=2, max_sessions_per_client=8)
    with in_process(Engine(Transcriber(tiny_target)), config) as a, \
            in_process(Engine(Transcriber(tiny_target)), config) as b:
        port = free_port()
        (tmp_path / "nginx.conf").write_text(nginx_conf((a.port, b.port), port, tmp_path))
        proc = subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        front = f"127.0.0.1:{port}"
        sessions = []
        try:
            deadline = time.monotonic() + 15
            while get(f"http://{front}/livez")[0] != 200:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (tmp_path / "error.log").read_text() if (tmp_path / "error.log").exists() else ""
                    pytest.fail(f"nginx did not serve within 15 s (exit {proc.poll()}): {log[-2000:]}")
                time.sleep(0.1)
            for _ in range(4):  # least connections: two on each
                ws = connect(f"ws://{front}/", open_timeout=10).__enter__()
                sessions.append(ws)
                ws.send(json.dumps({"type": "start"}))
                assert recv(ws, [])["type"] == "ready"
            assert (len(a.connections), len(b.connections)) == (2, 2)
            for srv in (a, b):  # readiness: full; liveness: up
                assert get(f"http://127.0.0.1:{srv.port}/health") == (503, b"full: all 2 sessions are in use\n")
                assert get(f"http://127.0.0.1:{srv.port}/livez") == (200, b"ok\n")
            assert get(f"http://{front}/health")[0] == 503
            with connect(f"ws://{front}/", open_timeout=10) as extra:  # both full: refused clearly, through nginx
                assert recv(extra, [])["code"] == "server_full"
            sessions.pop().close()
            deadline = time.monotonic() + 10
            while get(f"http://{front}/health")[0] != 200:  # one server has room: nginx finds it
                assert time.monotonic() < deadline, "no server ready 10 s after a session closed"
                time.sleep(0.1)
        finally:
            for ws in sessions:
                ws.close()
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
