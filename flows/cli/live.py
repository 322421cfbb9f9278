"""`om live …`: what a live Pi's extension (deployments/pi/om-memory.ts) asks om, and the endpoint that
answers it fast. A typer sub-app that flows.cli.main mounts.

Each command ingests the session file's new lines first, like the endpoint; neither imports litellm
or Prefect.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.markup import escape

from flows.cli.common import db_source, err, examples, out, print_json, state, warn_exposure, workspace
from flows.cli.placeholders import Typer
from om_core.errors import DatabaseMissing, InvalidArgument, OmError

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

PACKAGE = Path(__file__).resolve().parents[2] / "deployments" / "pi"
EXTENSION = PACKAGE / "om-memory.ts"

live_app = Typer(name="live", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                 help="Memory for a live Pi: the compaction and recall its om extension asks for, and the "
                 "endpoint that answers them in milliseconds.",
                 epilog=examples("pi install \"$(om live info --package)\"", "pi -e \"$(om live info --extension)\"",
                                 "om live endpoint",
                                 "om live compact SESSION.jsonl --leaf ID --first-kept ID --tokens-before 91000"))

WaitOpt = typer.Option(2.0, "--wait", min=0, metavar="SECONDS",
                       help="How long to wait for the database when another process is writing it.")


def _database_for(session_file: Path | None) -> tuple[Path, str, dict[str, Any] | None]:
    """The database om answers a session from, where that choice came from, and the running endpoint
    serving it: --db or OM_DB when given, else the database of the endpoint that serves the session's
    folder (`om serve --live DIR`, `om live endpoint`: every om process of this user finds its
    announcement), else om's default."""
    from flows.endpoint import endpoint_for_session, running_endpoint

    if not state.db_named and session_file is not None:
        found = endpoint_for_session(session_file)
        if found is not None:
            return Path(found["db"]), "the endpoint serving the session's folder", found
    db = state.db.resolve()
    return db, db_source(), running_endpoint(db)


def _live_workspace(wait: float, session_file: Path) -> Workspace:
    """The workspace for a live question about ``session_file``: its database must exist (a live
    question never creates one: it would hold nothing but this session, and answer nothing)."""
    from om_core.store.workspace import FileDatabase, Workspace

    db, source, _ = _database_for(session_file)
    if not db.exists():
        raise DatabaseMissing(f"no om database at {db} ({source}); nothing was created "
                              "(`om serve` or `om ingest` makes one)")
    ws = workspace()
    return Workspace(FileDatabase(db, wait), resolve=lambda: ws.resolved)


@live_app.command("info", epilog=examples("om live info", "om live info --json --session S.jsonl",
                                           "pi install \"$(om live info --package)\""))
def info(
    extension: bool = typer.Option(False, "--extension", help="Print only the path of the Pi extension file "
                                   "(`pi -e PATH`: one session)."),
    package: bool = typer.Option(False, "--package", help="Print only the path of the Pi package "
                                 "(`pi install PATH`: every session)."),
    session: Optional[Path] = typer.Option(None, "--session", metavar="FILE", help="The database for this session "
                                           "file: the endpoint serving its folder names it when --db and OM_DB "
                                           "do not."),
    as_json: bool = typer.Option(False, "--json", help='Print {"db", "db_source", "db_exists", "settings_files", '
                                 '"observations_pool_max_tokens", "self_compact", "warn_at", "passive", "consolidate_when_idle", "endpoint", "extension", "package"}.'),
) -> None:
    """Which database and settings om uses here (as every om command resolves them; for --session, the
    database of the endpoint serving that session's folder), whether an endpoint serves that database,
    and where the Pi extension and its package are."""
    if extension or package:
        sys.stdout.write(f"{EXTENSION if extension else PACKAGE}\n")
        return
    db, source, found = _database_for(session)
    resolved = workspace().resolved
    files = sorted({src.split(" (")[0] for src in resolved.sources.values()
                    if not src.startswith(("env ", "flag", "default"))})
    answer = {"db": str(db), "db_source": source, "db_exists": db.exists(), "settings_files": files,
              "observations_pool_max_tokens": resolved.settings.observationsPoolMaxTokens,
              "self_compact": resolved.settings.selfCompact, "warn_at": resolved.settings.warnAt,
              "passive": resolved.settings.passive, "consolidate_when_idle": resolved.settings.consolidateWhenIdle,
              "endpoint": {"url": found["url"], "pid": found["pid"]} if found else None,
              "extension": str(EXTENSION), "package": str(PACKAGE)}
    if as_json:
        print_json(answer)
        return
    out.print(f"database: {escape(str(db))} ({source}{'' if answer['db_exists'] else ', not created yet'})",
              highlight=False)
    out.print(f"settings: {escape(', '.join(files)) if files else 'defaults'}", highlight=False)
    out.print(f"endpoint: {found['url']} (pid {found['pid']})" if found else
              "endpoint: none (start one with `om live endpoint`, or `om serve`)", highlight=False)
    out.print(f"extension: {escape(str(EXTENSION))} (pi install {escape(str(PACKAGE))})", highlight=False)


def project_settings(cwd: Path, project: bool):
    """The settings a request from a session in ``cwd`` is answered with: what an om command run in that
    folder resolves (with this command's --config and environment); ``project`` False (Pi does not
    trust the folder): its own files do not count, as with --no-project-settings."""
    from om_core.settings import load_settings

    return load_settings(state.config, cwd=cwd, project=project).settings


@live_app.command("compact", epilog=examples(
    "om live compact S.jsonl --leaf 9f1c2e3a --first-kept 41aa07b2 --tokens-before 91200 --json"))
def compact(
    session_file: Path = typer.Argument(..., metavar="FILE", help="The live session file."),
    leaf: str = typer.Option(..., "--leaf", help="The branch tip Pi compacts at."),
    first_kept: str = typer.Option(..., "--first-kept", help="Pi's firstKeptEntryId."),
    tokens_before: int = typer.Option(0, "--tokens-before", min=0, metavar="N", help="Pi's tokensBefore (returned "
                                      "as given)."),
    instructions: Optional[str] = typer.Option(None, "--instructions", metavar="TEXT", help="Pi's customInstructions "
                                               "(`/compact TEXT`): added to the summary after the memory."),
    reason: Optional[str] = typer.Option(None, "--reason", metavar="REASON", help="Pi's reason: manual, threshold or "
                                         "overflow (a recovery: om never keeps more than Pi's cut then)."),
    deadline: Optional[float] = typer.Option(None, "--deadline", min=0.1, metavar="SECONDS", help="How long the hook "
                                             "waits for the answer: a catch-up of the observer stops before it."),
    wait: float = WaitOpt,
    by_endpoint: bool = typer.Option(True, "--endpoint/--no-endpoint", help="Ask the running endpoint that serves "
                                     "the session first (the extension, which asked it already, passes "
                                     "--no-endpoint)."),
    as_json: bool = typer.Option(False, "--json", help='Print {"session_id", "leaf", "compaction": {"summary", '
                                 '"firstKeptEntryId", "tokensBefore", "details"} or null, "declined", …}.'),
) -> None:
    """Ingest the file's new lines, then the compaction Pi's session_before_compact gets, gap-free: when
    the observer is behind Pi's cut, up to compactionCatchUpMaxChunks observer chunks first; then the
    memory folded at the first entry no observation covers (Pi's cut when none; what `om compact FILE
    --gap-safe --first-kept F --leaf LEAF` gives on that file), or why there is none (then Pi's own
    summarizer runs)."""
    asked = {"session_file": str(session_file.expanduser().absolute()), "leaf": leaf,
             "first_kept_entry_id": first_kept, "tokens_before": tokens_before, "custom_instructions": instructions,
             "reason": reason, "deadline_seconds": deadline}
    answer = _compact_by_endpoint(session_file, asked, wait) if by_endpoint else None
    if answer is None:
        answer = _compact_here(session_file, asked, wait)
    if as_json:
        print_json(answer)
    elif answer["compaction"] is None:
        err.print(f"declined: {escape(answer['declined'] or '')}", highlight=False)
    else:
        sys.stdout.write(answer["compaction"]["summary"] + "\n")


def _compact_by_endpoint(session_file: Path, asked: dict[str, Any], wait: float) -> dict[str, Any] | None:
    """The compaction from the running endpoint that serves this session's database (the same service,
    already loaded, its answer the same JSON), with this command's folder and project-settings choice as
    the session's; None when none serves it, or it does not answer (then ``_compact_here``). Not when
    --config names settings: the endpoint knows only its own and the session folder's."""
    from flows.endpoint import ask

    if state.config is not None:
        return None
    _, _, found = _database_for(session_file)
    if found is None:
        return None
    # a catch-up stops before the deadline; without one, the wait the command gives plus the endpoint's
    timeout = (asked["deadline_seconds"] or 30.0) + wait + 5.0
    try:
        return ask(found, "compact", {**asked, "cwd": os.getcwd(), "project_settings": state.project_settings},
                   timeout=timeout)
    except (OmError, OSError, ValueError):  # busy, refused, gone: the command answers on its own
        return None


def _compact_here(session_file: Path, asked: dict[str, Any], wait: float) -> dict[str, Any]:
    """The compaction answered by this process: the session file ingested and folded on the database
    (what the endpoint does, without its warm state)."""
    from om_core.usecases.live import CompactRequest, compact_live

    answer = compact_live(_live_workspace(wait, session_file), CompactRequest.model_validate(asked))
    return answer.model_dump(mode="json")


@live_app.command("recall", epilog=examples("om live recall 3f9a0c1b2d4e --file S.jsonl --leaf 9f1c2e3a --json",
                                             'om live recall --query "upload retries" --file S.jsonl --json'))
def recall(
    memory_id: Optional[str] = typer.Argument(None, metavar="[ID]", help="A 12-hex observation or reflection id."),
    query_text: Optional[str] = typer.Option(None, "--query", help="Words instead of an id: the memory and "
                                             "transcript they match, this session's branch first."),
    session_file: Path = typer.Option(..., "--file", help="The live session file."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="The branch tip (default: the file's current leaf)."),
    wait: float = WaitOpt,
    as_json: bool = typer.Option(False, "--json", help='Print the recall tool\'s result: {"content", "details"}.'),
) -> None:
    """Ingest the file's new lines, then the result of the `recall` tool (the TypeScript extension's
    shape): the exact evidence behind the id on that branch, or the hits of a query."""
    from pydantic import ValidationError

    from om_core.usecases.live import RecallRequest, recall_live

    try:
        request = RecallRequest(session_file=str(session_file), leaf=leaf, id=memory_id, query=query_text)
    except ValidationError:
        raise InvalidArgument("give an ID or --query WORDS (one of them)") from None
    result = recall_live(_live_workspace(wait, session_file), request)
    if as_json:
        print_json(result)
    else:
        sys.stdout.write(result["content"][0]["text"] + "\n")


@live_app.command("endpoint", epilog=examples("om live endpoint", "om --db /data/om.duckdb live endpoint --port 7311",
                                               "om live endpoint --sessions ~/work/pi-sessions"))
def endpoint(
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port on 127.0.0.1 (default: any free one)."),
    sessions: Optional[list[Path]] = typer.Option(
        None, "--sessions", metavar="DIR", help="A folder of Pi session files it answers for (repeatable; default: "
        "Pi's own, $PI_CODING_AGENT_SESSION_DIR or ~/.pi/agent/sessions). A request for any other file is refused."),
    wait: float = WaitOpt,
) -> None:
    """Answer the extension's compactions and recalls on 127.0.0.1 until Ctrl-C, for this database and
    the Pi session files under the session folders. It announces itself in this user's state folder
    ($XDG_STATE_HOME/om/endpoints, else ~/.local/state/om/endpoints: URL, token, pid, database, the
    folders it serves; this user only), where the extension and every om command find it. `om serve` runs the same endpoint; this
    is for teams without it."""
    from flows.endpoint import LiveEndpoint
    from flows.interrupt import serve_until_signal

    if state.db_existed:  # a new one is warned about when this command creates it
        warn_exposure(state.db)
    served = LiveEndpoint(workspace(), port=port, wait_seconds=wait, sessions=sessions,
                          on_answer=lambda line: err.print(escape(line), highlight=False),
                          settings_for=project_settings)

    def serve() -> None:  # started under the signal handling: a signal right after it is announced still cleans up
        served.start()
        err.print(f"om live endpoint on {served.url} for {escape(str(served.db_path))}, sessions under "
                  f"{escape(', '.join(map(str, served.sessions)))}; Ctrl-C stops", highlight=False)
        served.serve_forever()

    serve_until_signal(serve, cleanup=served.stop, farewell=lambda code: "endpoint stopped")
