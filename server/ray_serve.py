"""``asr_spec serve --ray``: the same app on Ray Serve, as N replicas that each hold their own model, engine and
file worker (docs/deploy.md).

Ray Serve's proxy (one per node, at ``--host``/``--port``) carries each HTTP request and each WebSocket connection to
one replica for its whole life: a session stays where it opened. Every connection counts as one of the replica's
ongoing requests, and a replica takes ``max_sessions`` of them at once: Ray's router sends a new session only to a
replica with room (the less busy of two it samples); when every replica is full, the session waits in Ray's queue
until one has room (the client's handshake timeout applies) rather than being refused. Requests to the HTTP endpoints
take a place while they run (uploads: until transcribed), so each replica also serves its Prometheus text on a port of
its own (``--metrics-port``), which Ray's queue never holds up. Autoscaling (``--min-replicas``/``--max-replicas``)
follows the ongoing requests, i.e. the sessions: Ray adds a replica while they average more than
``AUTOSCALE_TARGET`` of ``max_sessions``.

``ray`` (with Ray Serve) is an optional dependency: ``pip install "asr_spec[ray]"``."""
from __future__ import annotations

import logging
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from asr_spec.server.app import Server
from asr_spec.server.config import bearer_token, match_key
from asr_spec.server.settings import ServeSettings
from asr_spec.server.shared import Shared

from asr_spec.scaleout import INSTALL_HINT, RayUnavailable, connect

log = logging.getLogger("asr_spec.serve")
APP = "asr_spec"  # the Ray Serve application and deployment name
AUTOSCALE_TARGET = 0.75  # autoscaling's target of ongoing requests per replica, as a share of max_sessions


class Replica:
    """One Ray Serve replica: ``asr_spec serve``'s server, its ASGI app run by Ray's proxy and replica event loop
    instead of uvicorn. With ``metrics_port``, its Prometheus text is also served at ``metrics_port + R`` (R: the
    replica's rank on its node), so that every replica can be scraped."""

    def __init__(self, settings: ServeSettings, api_keys: tuple[str, ...]):
        from ray import serve

        from asr_spec.models.loader import load

        target, draft = load(settings.model_options())
        self.server = Server.build(settings, api_keys, target, draft)
        self.metrics_http: ThreadingHTTPServer | None = None
        if settings.metrics_port:
            rank = serve.get_replica_context().rank.local_rank
            self.metrics_http = metrics_endpoint(self.server.shared, settings.host, settings.metrics_port + rank)

    def __serve_build_asgi_app__(self):
        return self.server.hosted()

    async def __del__(self) -> None:
        """Ray Serve stops the replica (scale-down, shutdown): its sessions are drained as a single server's are."""
        if self.metrics_http is not None:
            self.metrics_http.shutdown()
        await self.server.shutdown()


def metrics_endpoint(shared: Shared, host: str, port: int) -> ThreadingHTTPServer:
    """``GET /metrics`` of the server whose parts are ``shared`` (Prometheus text; the server's API key, if it has
    any) on its own port, in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            token = bearer_token(self.headers.get("Authorization") or "")
            if self.path.split("?")[0] != "/metrics":
                return self._reply(404, b"not found\n", "text/plain")
            if shared.config.api_keys and match_key(shared.config.api_keys, token) is None:
                return self._reply(401, b"missing or wrong API key (Authorization: Bearer KEY)\n", "text/plain")
            body, content_type = shared.metrics.scrape(shared.engine, len(shared.sessions),
                                                       self.headers.get("Accept"))
            self._reply(200, body, content_type)

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # scrapes are not logged
            pass

    http = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=http.serve_forever, name="asr_spec-metrics", daemon=True).start()
    return http


def deployment_options(settings: ServeSettings) -> dict:
    """Ray Serve's options for the replicas: their count or autoscaling, their capacity, their CPUs or GPU."""
    sessions = settings.sessions()
    options = {"name": APP, "max_ongoing_requests": sessions,
               "graceful_shutdown_timeout_s": settings.drain_seconds + 5,
               "ray_actor_options": {"num_cpus": 0 if settings.cuda else max(1, settings.torch_threads()),
                                     "num_gpus": 1 if settings.cuda else 0}}
    if settings.min_replicas or settings.max_replicas:
        if not 1 <= settings.min_replicas <= settings.max_replicas:
            raise ValueError("--min-replicas and --max-replicas: both needed, 1 <= min <= max")
        options["autoscaling_config"] = {"min_replicas": settings.min_replicas, "max_replicas": settings.max_replicas,
                                         "target_ongoing_requests": max(1.0, AUTOSCALE_TARGET * sessions)}
    else:
        options["num_replicas"] = settings.replicas
    return options


def serve_on_ray(settings: ServeSettings, api_keys: tuple[str, ...]) -> int:
    """Deploy the replicas on the cluster (``settings.ray``: an address, or "local"), serve until SIGINT or
    SIGTERM, then shut Ray Serve down (each replica drains its sessions). Returns the exit status."""
    try:
        options = deployment_options(settings)
        connect(None if settings.ray == "local" else settings.ray)
        from ray import serve
    except (RayUnavailable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ImportError:
        print(f"error: {INSTALL_HINT}", file=sys.stderr)
        return 1
    serve.start(http_options={"host": settings.host, "port": settings.port})
    app = serve.deployment(serve.ingress()(Replica), **options).bind(settings, api_keys)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.run(app, name=APP, route_prefix="/", blocking=False)
        replicas = options.get("num_replicas") or f"{settings.min_replicas}-{settings.max_replicas}"
        log.info("listening on ws://%s:%d (Ray Serve, %s replica(s), %d sessions each)", settings.host, settings.port,
                 replicas, settings.sessions())
        stop.wait()
    finally:
        log.info("shutting down: Ray Serve drains every replica's sessions")
        serve.shutdown()
    return 0

