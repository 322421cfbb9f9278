"""The real Pi 1.6.0 in RPC mode, for the extension's tests and benchmark (tests/test_pi_live.py,
bench/perf/live_compaction.py).

Pi and the node it needs come from .ci/pi/node_modules (`.ci/run` installs them there with npm);
``missing()`` says why they cannot run here. Pi's provider is a fake OpenAI-compatible server
(tests/fake_openai.py) named in ``models.json`` of the agent directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parent.parent
PI_HOME = REPO / ".ci" / "pi" / "node_modules"
NODE = PI_HOME / "node" / "bin" / "node"
PI_CLI = PI_HOME / "@earendil-works" / "pi-coding-agent" / "dist" / "bundle" / "cli.js"
EXTENSION = REPO / "deployments" / "pi" / "om-memory.ts"


def missing() -> str | None:
    """Why the real Pi cannot run here, or None."""
    if not PI_CLI.is_file() or not NODE.is_file():
        return (f"Pi 1.6.0 and node 22 are not installed in {PI_HOME.parent} "
                "(run `cd .ci/pi && npm install --no-audit --no-fund`, as .ci/run does)")
    try:
        version = subprocess.run([str(NODE), "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError as exc:
        return f"the node in {NODE} does not run: {exc}"
    if not version.startswith("v2") or tuple(int(x) for x in version[1:].split(".")[:2]) < (22, 19):
        return f"Pi 1.6.0 needs node >= 22.19; {NODE} is {version or 'broken'}"
    return None


def agent_dir(home: Path, base_url: str, settings: dict[str, Any], models: Sequence[str] = ("fake-model",)) -> Path:
    """~/.pi/agent under ``home``: the fake model (or ``models``, to change between) as provider
    ``fake``, and Pi's settings."""
    agent = home / ".pi" / "agent"
    agent.mkdir(parents=True, exist_ok=True)
    (agent / "models.json").write_text(json.dumps({"providers": {"fake": {
        "baseUrl": base_url, "api": "openai-completions", "apiKey": "not-needed",
        "models": [{"id": m, "contextWindow": 128000, "maxTokens": 4096} for m in models]}}}))
    (agent / "settings.json").write_text(json.dumps(settings))
    return agent


class RpcPi:
    """One Pi process in RPC mode with the om extension (or ``extensions``); its stdout records are
    read by a thread."""

    def __init__(self, home: Path, cwd: Path, env: dict[str, str], *, session_dir: Path | None = None,
                 session_file: Path | None = None, extensions: Sequence[Path] = (EXTENSION,),
                 args: Sequence[str] = ()) -> None:
        where = ["--session", str(session_file)] if session_file else ["--session-dir", str(session_dir)]
        loads = [arg for path in extensions for arg in ("-e", str(path))]
        self.process = subprocess.Popen(
            [str(NODE), str(PI_CLI), "--mode", "rpc", *where, "--provider", "fake", "--model", "fake-model",
             *loads, "--offline", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
            env={**env, "HOME": str(home), "PI_CODING_AGENT_DIR": str(home / ".pi" / "agent")})
        self.records: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.process.stderr), daemon=True).start()
        self._ids = 0

    def _read(self) -> None:
        for line in self.process.stdout:  # LF-framed records (no text-mode line splitting)
            record = json.loads(line)
            with self.cond:
                self.records.append(record)
                self.cond.notify_all()
        with self.cond:
            self.records.append({"type": "__eof__"})
            self.cond.notify_all()

    def send(self, command: dict[str, Any]) -> str:
        self._ids += 1
        command = {"id": f"c{self._ids}", **command}
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        self.process.stdin.flush()
        return command["id"]

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], since: int = 0, timeout: float = 120) -> dict[str, Any]:
        """The first record from index ``since`` on that ``pred`` accepts."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for record in self.records[since:]:
                    if record.get("type") == "__eof__":
                        raise AssertionError("Pi exited: " + b"".join(self.stderr).decode(errors="replace")[-3000:])
                    if pred(record):
                        return record
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting; last records: {self.records[-5:]}")
                self.cond.wait(left)

    def mark(self) -> int:
        with self.cond:
            return len(self.records)

    def call(self, command: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        """Send a command and return its response."""
        since = self.mark()
        cid = self.send(command)
        return self.wait_for(lambda r: r.get("type") == "response" and r.get("id") == cid, since, timeout)

    def prompt(self, text: str, timeout: float = 120) -> int:
        """Send a prompt and wait until the agent settles; returns the index where its records start."""
        since = self.mark()
        self.send({"type": "prompt", "message": text})
        self.wait_for(lambda r: r.get("type") == "agent_settled", since, timeout)
        return since

    def notes(self, since: int = 0, method: str = "notify") -> list[str]:
        """The extension's notify lines (or setStatus texts) from index ``since`` on."""
        with self.cond:
            return [r.get("message") if method == "notify" else r.get("statusText")
                    for r in self.records[since:]
                    if r.get("type") == "extension_ui_request" and r.get("method") == method]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def session_entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def os_env(**extra: str) -> dict[str, str]:
    """This environment without the developer's om settings, plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OM_")}, **extra}
