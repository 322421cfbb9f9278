"""`om run` without a terminal (piped, in a log, under cron): no live board to redraw, so a line on
stderr as each session starts and ends, naming it by its short id and file, with the run's count and
elapsed time. What the board shows on a terminal, in lines a log keeps."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from flows import progress


def _counted(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def session_name(row: dict) -> str:
    """A session in a line: its short id, then its file name less what repeats the id."""
    from om_core.pi.session import file_label

    sid = row["session_id"]
    return f"{sid[:8]} {file_label(row.get('file') or '', sid)}".rstrip()


def progress_lines(rows: list[dict], said: dict[str, str], elapsed: float) -> list[str]:
    """The lines due since the last call: a session that started, one that ended (done or error).
    ``said`` (session id -> the last state announced) is updated."""
    lines = []
    finished = sum(r["state"] in ("done", "error") for r in rows)
    for row in rows:
        sid, state = row["session_id"], row["state"]
        before = said.get(sid)
        if state == "running" and before is None:
            said[sid] = state
            lines.append(f"replaying {session_name(row)}")
        elif state in ("done", "error") and before not in ("done", "error"):
            said[sid] = state
            what = (f"failed: {row['last']}" if state == "error" else
                    f"done: {_counted(row['recorded'], 'stage')} recorded memory, "
                    f"{_counted(row['calls'], 'model call')}, {_counted(row['compactions'], 'compaction')}")
            lines.append(f"{session_name(row)} {what} ({finished} of {len(rows)} sessions, {_clock(elapsed)} "
                         "elapsed)")
    return lines


class ProgressLines:
    """The run's progress as lines on ``console`` (stderr), called on each tick of the run's wait."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.said: dict[str, str] = {}

    def tick(self) -> None:
        rows = progress.snapshot()
        if not rows:
            return
        for line in progress_lines(rows, self.said, progress.timing(rows)[0]):
            self.console.print(escape(line), highlight=False, soft_wrap=True)
