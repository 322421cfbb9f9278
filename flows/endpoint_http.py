"""The live endpoint's HTTP side (flows.endpoint.LiveEndpoint serves with it): the threaded server and
the request handler that checks the token before reading a bounded body, and hands each request to
``LiveEndpoint.answer``. A module of its own so that finding and asking an endpoint (flows.endpoint,
the `om live` commands) does not load Python's HTTP server.
"""

from __future__ import annotations

import json
import secrets
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

MAX_BODY_BYTES = 1 << 20  # a compact or recall request is a few hundred bytes
BACKLOG = 512  # connections waiting to be accepted: a burst of recalls from many sessions (5 reset most of 200)


class Answering(Protocol):
    """What the handler asks of the endpoint it serves (flows.endpoint.LiveEndpoint)."""

    token: str
    socket_seconds: float

    def answer(self, op: str, body: dict[str, Any],
               after_reply: ExitStack | None = None) -> tuple[int, dict[str, Any]]: ...


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = BACKLOG

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: ANN401
        """A connection that broke mid-request (reset, timed out) is closed without a traceback."""


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def handler(endpoint: Answering) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = endpoint.socket_seconds  # on the socket: an idle or trickling connection is closed

        def log_message(self, *args: object) -> None:  # one line per answer goes through on_answer
            pass

        def _reply(self, status: int, payload: dict[str, Any], close: bool = False) -> None:
            """The answer; ``close``: the request's body was not read, so the connection cannot carry another."""
            data = json.dumps(payload, ensure_ascii=False, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            return secrets.compare_digest(self.headers.get("Authorization", "").encode(),
                                          f"Bearer {endpoint.token}".encode())

        def _body(self) -> dict[str, Any]:
            """The JSON body, read only up to its declared, bounded length."""
            if self.headers.get("Transfer-Encoding"):
                raise _BadRequest(411, "send the body with a Content-Length (no Transfer-Encoding)")
            declared = (self.headers.get("Content-Length") or "0").strip()
            if not declared.isdigit():
                raise _BadRequest(400, f"bad Content-Length {declared[:40]!r}")
            length = int(declared)
            if length > MAX_BODY_BYTES:
                raise _BadRequest(413, f"the request body is {length} bytes; at most {MAX_BODY_BYTES} are read")
            data = self.rfile.read(length) if length else b""
            if len(data) < length:
                raise _BadRequest(400, "the request body ended before its Content-Length")
            try:
                body = json.loads(data or b"{}")
            except RecursionError:
                raise _BadRequest(400, "the request body is nested too deeply") from None
            except ValueError:
                raise _BadRequest(400, "the request body is not JSON") from None
            return body if isinstance(body, dict) else {}

        def _serve(self, read_body: bool) -> None:
            if not self._authorized():  # before a byte of the body is read
                self._reply(401, {"error": "missing or wrong token (read it from the endpoint file)"}, close=True)
                return
            try:
                body = self._body() if read_body else {}
            except _BadRequest as exc:
                self._reply(exc.status, {"error": str(exc)}, close=True)
                return
            with ExitStack() as after_reply:  # the database is let go once the answer is sent
                try:
                    status, payload = endpoint.answer(self.path.strip("/"), body, after_reply)
                except Exception as exc:  # never a dead endpoint: the extension declines with this line
                    status, payload = 500, {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
                self._reply(status, payload)

        def do_GET(self) -> None:  # noqa: N802
            self._serve(read_body=False)
            if self.headers.get("Content-Length", "0").strip() not in ("", "0"):
                self.close_connection = True  # a GET's body is never read

        def do_POST(self) -> None:  # noqa: N802
            self._serve(read_body=True)

    return Handler
