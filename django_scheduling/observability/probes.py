"""A small HTTP server for the liveness probe of a ``runscheduler`` process, which has no web
server of its own: ``runscheduler --health-port 8081`` answers ``GET /live`` as the project's
``scheduling/live/`` does."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["serve_probe"]

Probe = Callable[[], tuple[int, dict[str, Any]]]


def serve_probe(port: int, probe: Probe, addr: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve *probe* (which returns a status and a JSON body) at ``/live`` on *port*, from a
    daemon thread; return the server (``shutdown()`` stops it). Raise ``OSError`` when the port
    cannot be bound."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0].rstrip("/") != "/live":
                self._answer(404, {"detail": "Not found: the probe is at /live."})
                return
            try:
                status, body = probe()
            except Exception as exc:  # the probe itself broke: that is not alive
                status, body = 503, {"alive": False, "problems": [f"{type(exc).__name__}"]}
            self._answer(status, body)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a probe every few seconds would fill the log

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="scheduling-probe", daemon=True)
    thread.start()
    return server
