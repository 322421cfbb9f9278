"""Another local user for the attack tests: uid nobody, through setpriv (needs root), speaking HTTP with
curl (this checkout's interpreter may sit where nobody cannot read)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def need_another_user() -> None:
    """Skip the test (with the reason) where no other user's process can be started."""
    if os.geteuid() != 0:
        pytest.skip("starting a process as nobody needs root")
    for tool in ("setpriv", "curl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def as_nobody(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    need_another_user()
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=timeout, cwd="/")


def http_as_nobody(method: str, url: str, headers: dict[str, str] | None = None,
                   body: str | None = None) -> tuple[int, dict[str, str], str]:
    """One request as nobody: its status, headers (lower-case names) and body."""
    args = ["curl", "-s", "-i", "-m", "20", "-X", method, url]
    for name, value in (headers or {}).items():
        args += ["-H", f"{name}: {value}"]
    if body is not None:
        args += ["--data-binary", body]
    done = as_nobody(*args)
    assert done.returncode == 0, f"curl as nobody failed ({done.returncode}): {done.stderr}"
    head, _, text = done.stdout.replace("\r\n", "\n").partition("\n\n")
    status_line, *lines = head.splitlines()
    found = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), found, text


@contextmanager
def traversable(path: Path) -> Iterator[None]:
    """Every folder above ``path`` searchable by others (o+x, no listing) while the block runs, as a home
    folder often is: so what another user is refused is the file's own mode, not pytest's 0700 temp root."""
    changed = []
    for folder in reversed(Path(path).parents):
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(folder, stat.S_IMODE(mode) | stat.S_IXOTH)
            changed.append((folder, stat.S_IMODE(mode)))
    try:
        yield
    finally:
        for folder, mode in reversed(changed):
            os.chmod(folder, mode)
