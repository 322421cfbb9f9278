"""The live endpoint: what a live Pi's extension asks om (compaction, recall), answered on 127.0.0.1 by
a process that keeps om loaded, so an answer costs the work (tens of milliseconds) and not a Python
start (a second or more: measured in bench/perf/live_compaction.py).

One endpoint per database. It announces itself in this user's state folder
(``$XDG_STATE_HOME/om/endpoints``, else ``~/.local/state/om/endpoints``; the folder 0700, the file
0600): its URL, a token, its pid, the database and the session folders it serves. Every om process of
this user looks there, and so does the extension: a session file under a served folder is answered
by that endpoint, with that database, without any setting naming it. The token keeps other local
users from reading sessions through it; an announcement is believed only when this user owns it, no
one else can read it, it names a loopback URL and a live process of this user.

What it reads is bounded before it reads it: the token is checked before the body, a body over
``MAX_BODY_BYTES`` (flows.endpoint_http) is refused (413) unread, a bad length or JSON nested too deep is a 400 (never a
traceback), an idle or slow connection is closed after ``SOCKET_SECONDS``, and the listen backlog
holds the bursts of concurrent recalls a busy Pi sends. A request names a session file: only a Pi
session file under the folders the endpoint serves (``om serve --live DIR``, ``om live endpoint
--sessions DIR``) is read; anything else is refused before it is opened as a session, so nothing
of it reaches the database (not even its quarantine).

Requests for different session files are answered side by side: they share one open of the database
(``SharedFileDatabase``: a cursor each, so DuckDB reads for them in parallel), and only the requests
for one file wait for each other (its new lines are ingested by one request at a time). The file is
opened when a request arrives and let go ``HOLD_SECONDS`` after the last answer in progress is sent (a
burst shares one open), so an analyst's ``om sql`` and ``om serve``'s runs get the file between bursts.
A compaction's answer is sent before the search index of the lines it ingested is updated. A request that cannot get the file
within ``wait_seconds`` (another process is writing it) is answered "busy": the extension then
declines, and Pi's own summarizer runs. The extension bounds its own wait, so a long queue makes it
decline too, never block Pi.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import secrets
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from om_core.errors import DatabaseBusy, OmError
from om_core.store.private_files import private_dir, write_private
from om_core.usecases.live_sessions import LiveSessions

if TYPE_CHECKING:  # the serving side's modules load with LiveEndpoint: finding and asking one is light
    from http.server import ThreadingHTTPServer

    from om_core.settings import Settings
    from om_core.store.workspace import Workspace
    from om_core.usecases.live import CompactRequest, RecallRequest

HOST = "127.0.0.1"
QUEUE_SECONDS = 30.0  # a request waits its turn this long at most; the extension gives up sooner by itself
SOCKET_SECONDS = 10.0  # a connection idle (or trickling) this long is closed
# The file stays open this long after the last answer: a burst (sessions compacting together, a turn's
# recalls) arrives within it and shares one open instead of paying an open and a checkpointing close
# (tens of ms) each; another process wanting the file (`om sql`, a run) waits at most this much longer.
HOLD_SECONDS = 1.0


def default_session_folders() -> list[Path]:
    """Where Pi keeps its sessions unless told otherwise (PI_CODING_AGENT_SESSION_DIR, else the agent
    directory's ``sessions``)."""
    if os.environ.get("PI_CODING_AGENT_SESSION_DIR"):
        return [Path(os.environ["PI_CODING_AGENT_SESSION_DIR"]).expanduser()]
    agent = Path(os.environ.get("PI_CODING_AGENT_DIR") or Path.home() / ".pi" / "agent").expanduser()
    return [agent / "sessions"]


def state_dir() -> Path:
    """om's folder in the user's state directory: ``$XDG_STATE_HOME/om``, else ``~/.local/state/om``."""
    base = os.environ.get("XDG_STATE_HOME")
    return (Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "state") / "om"


def endpoints_folder() -> Path:
    """Where every endpoint of this user announces itself (the extension looks here too)."""
    return state_dir() / "endpoints"


def endpoint_file(db_path: str | os.PathLike) -> Path:
    """Where the endpoint of this database announces itself: a name derived from the database's path."""
    key = hashlib.sha256(str(Path(db_path).resolve()).encode()).hexdigest()[:16]
    return endpoints_folder() / f"{key}.json"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _own_live_pid(pid: int) -> bool:
    """A live process of this user's (on Linux its /proc entry says whose; elsewhere the signal check)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except FileNotFoundError:
        return not os.path.exists("/proc/self") and _pid_alive(pid)
    except OSError:
        return False


def _loopback(url: Any) -> bool:
    try:
        parsed = urllib.parse.urlsplit(str(url))
        return parsed.scheme == "http" and ipaddress.ip_address(parsed.hostname or "").is_loopback
    except ValueError:
        return False


def _private_folder(folder: Path) -> bool:
    """This user's folder, which no one else may write (so no one else can plant an announcement)."""
    try:
        info = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def read_announcement(path: Path) -> dict[str, Any] | None:
    """The announcement in ``path`` when this user's endpoint wrote it: a regular file owned by this user
    and readable by no one else, a loopback URL, a token, a live pid, an absolute database path and the
    session folders it serves. None otherwise (a stale or planted file is never believed)."""
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            return None
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not _loopback(found.get("url")) or not isinstance(found.get("token"), str):
        return None
    if not isinstance(found.get("db"), str) or not Path(found["db"]).is_absolute():
        return None
    sessions = found.get("sessions")
    if not isinstance(sessions, list) or not all(isinstance(s, str) and Path(s).is_absolute() for s in sessions):
        return None
    try:
        pid = int(found.get("pid") or 0)
    except (TypeError, ValueError):
        return None
    return found if pid > 0 and _own_live_pid(pid) else None


def running_endpoint(db_path: str | os.PathLike) -> dict[str, Any] | None:
    """The announcement of the endpoint serving this database, when it is one this user's endpoint wrote
    (``read_announcement``) and names this database. (The Pi extension applies the same rules before
    it sends anything to an endpoint.)"""
    if not _private_folder(endpoints_folder()):
        return None
    found = read_announcement(endpoint_file(db_path))
    return found if found is not None and found["db"] == str(Path(db_path).resolve()) else None


def endpoint_for_session(session_file: str | os.PathLike) -> dict[str, Any] | None:
    """The running endpoint that serves ``session_file`` (the file under one of its session folders,
    links followed), or None: where a session's memory is when nothing names a database. When several
    serve it, the one with the closest folder (then the latest started) wins."""
    folder = endpoints_folder()
    if not _private_folder(folder):
        return None
    path = Path(session_file).expanduser().resolve()
    best: tuple[int, float, dict[str, Any]] | None = None
    for candidate in sorted(folder.glob("*.json")):
        found = read_announcement(candidate)
        if found is None:
            continue
        depths = [len(Path(s).parts) for s in found["sessions"] if path.is_relative_to(Path(s))]
        if depths:
            rank = (max(depths), float(found.get("started") or 0), found)
            if best is None or rank[:2] > best[:2]:
                best = rank
    return best[2] if best else None


def ask(announcement: dict[str, Any], op: str, payload: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    """One request to a running endpoint (tests, the bench, ``om live info``); raises OmError on an
    error answer."""
    import urllib.error  # here: the HTTP client (http.client, email, ssl) only when an endpoint is asked
    import urllib.request

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
                 sessions: Iterable[str | os.PathLike] | None = None, socket_seconds: float = SOCKET_SECONDS,
                 on_answer: Callable[[str], None] | None = None,
                 settings_for: Callable[[Path, bool], Settings] | None = None) -> None:
        from om_core.store.workspace import SharedFileDatabase, Workspace

        if not ws.has_file:
            raise TypeError("the live endpoint serves a database file")
        self.db_path = ws.path.resolve()
        # the session folders it reads from (default: Pi's own); a request for any other file is refused
        self.sessions = [Path(p).expanduser().resolve() for p in (sessions or default_session_folders())]
        # one open of the file for the requests in progress; opening it waits at most wait_seconds for
        # another writer: then the answer is "busy"
        self.db = SharedFileDatabase(self.db_path, wait_seconds, hold_seconds=HOLD_SECONDS)
        self.ws = Workspace(self.db, ws.settings)
        # a request naming its session's folder (cwd) gets that project's settings, as an om command
        # run there would (project False: the folder is not trusted, its own files do not count)
        self.settings_for = settings_for
        self.port, self.wait_seconds, self.on_answer = port, wait_seconds, on_answer or (lambda line: None)
        self.socket_seconds = socket_seconds
        self.token = secrets.token_hex(16)
        self._files_lock = threading.Lock()
        self._file_locks: dict[Path, threading.Lock] = {}  # one request at a time per session file
        # what each session's answers keep between them (its branch, its file as ingested, its answers)
        self.live = LiveSessions()
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
        from om_core.usecases.live import warm

        warm()  # before it is announced: its first answer is as fast as the others
        from flows.endpoint_http import Server, handler

        self._server = Server((HOST, self.port), handler(self))
        self._announce()
        self._thread = threading.Thread(target=self._server.serve_forever, name="om-live-endpoint", daemon=True)
        self._thread.start()
        return self

    def _announce(self) -> None:
        folder = endpoints_folder()
        private_dir(folder)
        if not _private_folder(folder):  # made by hand, or by an older om: this user's only, or refuse
            try:
                if folder.lstat().st_uid != os.geteuid():
                    raise OmError(f"{folder} belongs to another user: the endpoint cannot announce itself there")
                folder.chmod(0o700)
            except OSError as exc:
                raise OmError(f"cannot use {folder} for the endpoint's announcement: {exc.strerror or exc}") from None
        text = json.dumps({"url": self.url, "token": self.token, "pid": os.getpid(), "db": str(self.db_path),
                           "sessions": [str(p) for p in self.sessions], "started": time.time()})
        write_private(endpoint_file(self.db_path), text.encode())  # the token: this user only

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        self.db.close()  # not HOLD_SECONDS later: the file is free once the endpoint has stopped
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
                "sessions": [str(p) for p in self.sessions],
                "observationsPoolMaxTokens": self.ws.settings.observationsPoolMaxTokens}

    def session_file(self, name: str) -> Path:
        """The request's session file, resolved (links followed), when it is a Pi session file under a
        folder this endpoint serves; OmError otherwise, before anything of it is ingested."""
        from om_core.pi.session import file_header

        path = Path(name).expanduser()
        if not path.is_absolute():
            raise OmError(f"the session file must be an absolute path, not {name!r}")
        path = path.resolve()
        if not any(path.is_relative_to(folder) for folder in self.sessions):
            raise OmError(f"{path} is not under the session folders this endpoint serves "
                          f"({', '.join(map(str, self.sessions))}; om live endpoint --sessions DIR adds one)")
        if not path.is_file():
            raise OmError(f"no session file at {path}")
        try:
            header = file_header(path, max_bytes=1 << 16)
        except OSError as exc:
            raise OmError(f"cannot read {path}: {exc.strerror or exc}") from None
        if header is None:
            raise OmError(f"{path} is not a Pi session file (no session header in its first lines)")
        return path

    def _file_lock(self, path: Path) -> threading.Lock:
        with self._files_lock:
            return self._file_locks.setdefault(path, threading.Lock())

    def _workspace(self, request: CompactRequest | RecallRequest) -> Workspace:
        """The endpoint's workspace, with the settings of the request's project when it names its folder."""
        from om_core.store.workspace import Workspace

        cwd = getattr(request, "cwd", None)
        if cwd is None or self.settings_for is None:
            return self.ws
        folder = Path(cwd)
        if not folder.is_absolute() or not folder.is_dir():
            raise OmError(f"the session's folder must be an existing absolute path, not {cwd!r}")
        return Workspace(self.db, self.settings_for(folder, request.project_settings))

    def _index_after_reply(self, ws: Workspace, path: Path, session_id: str) -> None:
        """The search index of what a compaction ingested, once its answer is sent (one writer of the
        session at a time, as for its requests). A failure leaves the index behind (a later ingest of the
        session catches up); it is logged, never raised."""
        from om_core.recall.search import refresh_session_index

        with self._file_lock(path):
            try:
                refresh_session_index(ws, [session_id])
            except Exception as exc:  # noqa: BLE001 - the answer is sent; the index is derived
                self.on_answer(f"index of {session_id} left behind: {type(exc).__name__}: {' '.join(str(exc).split())}")

    def answer(self, op: str, body: dict[str, Any], after_reply: ExitStack | None = None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON answer) for one request. ``after_reply``: the caller closes it once the
        answer is sent, so the database is let go (and checkpointed) after the reply, not before."""
        from pydantic import ValidationError

        from om_core.usecases.live import CompactRequest, RecallRequest, compact_live, recall_live

        started = time.perf_counter()
        if op == "info":
            return 200, {"result": self.info()}
        models = {"compact": CompactRequest, "recall": RecallRequest}
        if op not in models:
            return 404, {"error": f"unknown request {op!r}: compact, recall or info"}
        model = models[op]
        try:
            request = model.model_validate(body)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
            return 400, {"error": f"bad {op} request: {problems}"}
        try:
            path = self.session_file(request.session_file)
        except OmError as exc:
            return 403, {"error": str(exc)}
        request.session_file = str(path)
        try:
            ws = self._workspace(request)
        except OmError as exc:  # a bad folder, or that project's settings are invalid
            return 422, {"error": str(exc)}
        one_file = self._file_lock(path)
        if not one_file.acquire(timeout=QUEUE_SECONDS):
            return 503, {"error": f"om answered other requests for {path.name} for {QUEUE_SECONDS:.0f} s "
                                  "without reaching this one"}
        # the file held for this answer, and given after_reply until it is sent (the close checkpoints)
        held = after_reply if after_reply is not None else ExitStack()
        try:
            held.enter_context(self.db.holding())  # opened first: a change by another process is seen now
            kept = self.live.session(path, self.db.changed_by_others)
            if op == "compact":  # its answer needs no search index: the index of the new lines after the reply
                result = compact_live(ws, request, index=after_reply is None, kept=kept)
                if after_reply is not None and result.entries_added:
                    after_reply.callback(self._index_after_reply, ws, path, result.session_id)
            else:
                result = recall_live(ws, request, kept=kept)
        except DatabaseBusy as exc:
            return 503, {"error": str(exc)}
        except OmError as exc:
            return 422, {"error": str(exc)}
        finally:
            one_file.release()
            if after_reply is None:
                held.close()
        ms = (time.perf_counter() - started) * 1000
        if op == "compact":
            what = (f"{result.observations} observation(s), {result.reflections} reflection(s)" if result.compaction
                    else f"declined: {result.declined}")
            self.on_answer(f"compact {result.session_id} at {request.first_kept_entry_id}: {what} ({ms:.0f} ms)")
            return 200, {"result": result.model_dump(mode="json")}
        what = request.id if request.id is not None else "by query"  # the query's words stay out of the log
        self.on_answer(f"recall {what}: {result['details']['status']} ({ms:.0f} ms)")
        return 200, {"result": result}
