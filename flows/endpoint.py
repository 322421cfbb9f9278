"""The live endpoint: what a live Pi's extension asks om (compaction, recall), answered on 127.0.0.1 by
a process that keeps om loaded, so an answer costs the work (tens of milliseconds) and not a Python
start (a second or more: measured in bench/live_compaction.py).

One endpoint per database. It announces itself in a file next to the database
(``<db>.endpoint.json``: its URL, a token and its pid, readable by this user only), which is how the
extension finds it; the token keeps other local users from reading sessions through it. Requests
are answered one at a time, in turn (the process is the database's writer while it ingests), each on a
connection opened for it and closed after, so an analyst's ``om sql`` and ``om serve``'s runs get
the file between answers. A request that cannot get the file within ``wait_seconds`` (another
process is writing it) is answered "busy": the extension then declines, and Pi's own summarizer
runs. The extension bounds its own wait, so a long queue makes it decline too, never block Pi.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from om_core.errors import DatabaseBusy, OmError
from om_core.live import CompactRequest, RecallRequest, compact_live, recall_live, warm
from om_core.workspace import FileDatabase, Workspace

HOST = "127.0.0.1"
QUEUE_SECONDS = 30.0  # a request waits its turn this long at most; the extension gives up sooner by itself


def endpoint_file(db_path: str | os.PathLike) -> Path:
    """Where the endpoint of this database announces itself."""
    return Path(str(Path(db_path).resolve()) + ".endpoint.json")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_endpoint(db_path: str | os.PathLike) -> dict[str, Any] | None:
    """The announcement of the endpoint serving this database, when its process is alive."""
    path = endpoint_file(db_path)
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and _pid_alive(int(found.get("pid") or 0)) else None


def ask(announcement: dict[str, Any], op: str, payload: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    """One request to a running endpoint (tests, the bench, ``om live info``); raises OmError on an
    error answer."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(f"{announcement['url']}/{op}", data=data, method="GET" if data is None else "POST",
                                     headers={"Authorization": f"Bearer {announcement['token']}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read() or b"{}")
    if "error" in answer:
        raise OmError(answer["error"])
    return answer["result"]


class LiveEndpoint:
    """``start()`` binds 127.0.0.1 (``port`` 0: any free port), announces itself and answers in a
    thread; ``stop()`` stops it and removes the announcement. ``on_answer`` gets one line per request."""

    def __init__(self, ws: Workspace, *, port: int = 0, wait_seconds: float = 2.0,
                 on_answer: Callable[[str], None] | None = None) -> None:
        if ws.path is None:
            raise TypeError("the live endpoint serves a database file")
        self.db_path = ws.path.resolve()
        # opening the file waits at most wait_seconds for another writer: then the answer is "busy"
        self.ws = Workspace(FileDatabase(self.db_path, wait_seconds), ws.settings)
        self.port, self.wait_seconds, self.on_answer = port, wait_seconds, on_answer or (lambda line: None)
        self.token = secrets.token_hex(16)
        self.lock = threading.Lock()  # one answer at a time: this process is the writer while it ingests
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://{HOST}:{self._server.server_address[1]}"

    def start(self) -> LiveEndpoint:
        other = running_endpoint(self.db_path)
        if other is not None and other.get("pid") != os.getpid():
            raise OmError(f"an endpoint for {self.db_path} is already running (pid {other['pid']}, {other['url']})")
        warm()  # before it is announced: its first answer is as fast as the others
        self._server = ThreadingHTTPServer((HOST, self.port), _handler(self))
        self._server.daemon_threads = True
        self._announce()
        self._thread = threading.Thread(target=self._server.serve_forever, name="om-live-endpoint", daemon=True)
        self._thread.start()
        return self

    def _announce(self) -> None:
        path = endpoint_file(self.db_path)
        text = json.dumps({"url": self.url, "token": self.token, "pid": os.getpid(), "db": str(self.db_path)})
        partial = path.with_name(path.name + f".{os.getpid()}.tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the token: this user only
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(partial, path)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        path = endpoint_file(self.db_path)
        try:
            if json.loads(path.read_text()).get("token") == self.token:  # ours, not a later endpoint's
                path.unlink()
        except (OSError, ValueError):
            pass

    def serve_forever(self) -> None:
        """Block until ``stop()`` (another thread, a signal handler)."""
        while self._server is not None:
            time.sleep(0.2)

    def __enter__(self) -> LiveEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ answering

    def info(self) -> dict[str, Any]:
        return {"db": str(self.db_path), "pid": os.getpid(), "url": self.url,
                "observationsPoolMaxTokens": self.ws.settings.observationsPoolMaxTokens}

    def answer(self, op: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON answer) for one request."""
        started = time.perf_counter()
        if op == "info":
            return 200, {"result": self.info()}
        handlers = {"compact": (CompactRequest, compact_live), "recall": (RecallRequest, recall_live)}
        if op not in handlers:
            return 404, {"error": f"unknown request {op!r}: compact, recall or info"}
        model, handler = handlers[op]
        try:
            request = model.model_validate(body)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
            return 400, {"error": f"bad {op} request: {problems}"}
        if not self.lock.acquire(timeout=QUEUE_SECONDS):
            return 503, {"error": f"om answered other sessions for {QUEUE_SECONDS:.0f} s without reaching this one"}
        try:
            result = handler(self.ws, request)
        except DatabaseBusy as exc:
            return 503, {"error": str(exc)}
        except OmError as exc:
            return 422, {"error": str(exc)}
        finally:
            self.lock.release()
        ms = (time.perf_counter() - started) * 1000
        if op == "compact":
            what = (f"{result.observations} observation(s), {result.reflections} reflection(s)" if result.compaction
                    else f"declined: {result.declined}")
            self.on_answer(f"compact {result.session_id} at {request.first_kept_entry_id}: {what} ({ms:.0f} ms)")
            return 200, {"result": result.model_dump(mode="json")}
        self.on_answer(f"recall {request.id}: {result['details']['status']} ({ms:.0f} ms)")
        return 200, {"result": result}


def _handler(endpoint: LiveEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # one line per answer goes through on_answer
            pass

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload, ensure_ascii=False, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, body: dict[str, Any]) -> None:
            if not secrets.compare_digest(self.headers.get("Authorization", ""), f"Bearer {endpoint.token}"):
                self._reply(401, {"error": "missing or wrong token (read it from the endpoint file)"})
                return
            try:
                status, payload = endpoint.answer(self.path.strip("/"), body)
            except Exception as exc:  # never a dead endpoint: the extension declines with this line
                status, payload = 500, {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            self._reply(status, payload)

        def do_GET(self) -> None:  # noqa: N802
            self._serve({})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._reply(400, {"error": "the request body is not JSON"})
                return
            self._serve(body if isinstance(body, dict) else {})

    return Handler
