"""`om ARGS` in the test's own process, through the console entry point (flows.cli.launch.main): the
same error handler, exit code, stdout and stderr a user gets, without a new interpreter's start
(a second or more per call on a loaded machine). Tests whose point is the process boundary (a
signal, kill -9, what a fresh process imports, a terminal's width) start a real process instead."""

from __future__ import annotations

import re

import io
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path


class _Text(io.StringIO):
    """A captured stream that, like a pipe, is no terminal (Rich then prints plain text)."""

    def isatty(self) -> bool:
        return False


def _stream_handlers() -> list[logging.StreamHandler]:
    """Every handler that writes to a stream (not a file), on every logger that exists."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                     if isinstance(lg, logging.Logger))]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


def run_om(args: list[str], cwd: Path, env: Mapping[str, str] | None = None,
           stdin: str = "") -> subprocess.CompletedProcess:
    """Run `om ARGS` in cwd with exactly the environment ``env`` (default: this process's), as
    ``subprocess.run([... 'om', *args], env=env, capture_output=True, text=True)`` would."""
    from flows.cli.launch import main

    saved_env, saved_cwd, saved_argv, saved_stdin = dict(os.environ), os.getcwd(), sys.argv, sys.stdin
    saved_umask = os.umask(0o022)  # main() makes the process's files private: this process gets its own back
    os.umask(saved_umask)
    out, err = _Text(), _Text()
    code: int | str | None = 0
    handlers: dict[logging.StreamHandler, object] = {}
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.chdir(cwd)
        sys.argv = ["om", *map(str, args)]
        sys.stdin = io.StringIO(stdin)
        # A handler made before this call (litellm's, Prefect's) holds the stream it was given then: in
        # a real process that is the process's stderr, so here it writes to the captured one too.
        for h in _stream_handlers():  # assigned, not setStream(): that flushes, and a stream may be closed
            handlers[h], h.stream = h.stream, (out if h.stream in (sys.stdout, sys.__stdout__) else err)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code
    finally:
        for handler, stream in handlers.items():
            handler.stream = stream
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        os.umask(saved_umask)
        sys.argv, sys.stdin = saved_argv, saved_stdin
    returncode = code if isinstance(code, int) else (0 if code is None else 1)
    return subprocess.CompletedProcess(["om", *args], returncode, out.getvalue(), err.getvalue())


PROGRESS_LINE = re.compile(r"^replaying \S+|\(\d+ of \d+ sessions?, [\d:]+ elapsed\)$|^Prefect API: ")


def progress_line(line: str) -> bool:
    """A line of `om run`'s piped progress (the Prefect API it uses, a session started or ended): progress,
    not an error line."""
    return PROGRESS_LINE.search(line.strip()) is not None
