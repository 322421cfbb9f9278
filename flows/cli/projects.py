"""`om project`, `om search`, `om forget`: project memory, search over all memory, and a user's
retirement of a memory id. Reading imports neither litellm nor Prefect; `om project
--reflect` loads the workers' model only when it runs one."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape

from flows.cli.common import (ApiBaseOpt, ModelOpt, app, err, examples, out, print_json, print_rows, text_width,
                              workspace)
from om_core.errors import InvalidArgument
from om_core.recall.kinds import SearchKind

if TYPE_CHECKING:
    from om_core.recall.search import HitPlace, SearchHit
    from om_core.store.workspace import Workspace


@app.command(epilog=examples('om project', 'om project ~/src/app --json', 'om project --list',
                            'om project github.com/acme/app --reflect --model openai/gpt-4o-mini'))
def project(
    path: Optional[str] = typer.Argument(None, metavar="[PATH]", help="A folder (default: the current one), a "
                                         "project id, or a project's name."),
    list_all: bool = typer.Option(False, "--list", help="List every project instead."),
    reflect: bool = typer.Option(False, "--reflect", help="Run the project stage now on what its sessions recorded "
                                 "since it last read, even below projectReflectAfterTokens."),
    model: ModelOpt = None,
    api_base: ApiBaseOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print the project (or the list) as JSON."),
) -> None:
    """A project's memory: the durable reflections distilled from the sessions that worked in its
    repository, each citing the session memory ids it rests on (om recall ID shows their evidence).

    A project is the repository a session worked in: the git work tree holding the session's cwd, known
    by its remote (origin) when it has one, else by its root; a session whose folder is no git work tree
    (or was gone at its first ingest) belongs to the project of its path. The `projects` setting maps a
    folder to a project id of your choice. om run and om serve run the project stage when a project's
    sessions recorded projectReflectAfterTokens of reflections and critical observations since it last
    read them."""
    from om_core.memory.project_memory import show_project

    ws = workspace()
    if list_all:
        from om_core.store.repository import list_projects

        with ws.read() as con:
            projects = list_projects(con)
        if as_json:
            print_json([p.model_dump(mode="json") for p in projects])
            return
        if not projects:
            err.print("no project yet: no ingested session names a working folder")
            return
        print_rows(["project", "name", "sessions", "reflections", "new tokens", "how"],
                   [[p.project_id, p.name, str(p.sessions), str(p.reflections), f"{p.new_tokens:g}", p.how]
                    for p in projects])
        return
    if reflect:
        _reflect(ws, path, model, api_base, as_json)
        return
    view = show_project(ws, path)
    if as_json:
        print_json(view.as_json())
        return
    out.print(f"[bold]{escape(view.project_id)}[/] ({view.how.replace('_', ' ')}; {len(view.sessions)} session(s))",
              highlight=False)
    for root in view.git_roots:
        out.print(f"  work tree {escape(root)}", highlight=False)
    if not view.reflections:
        err.print(f"no project memory yet ({view.new_tokens:g} of {view.threshold} tokens of new session memory "
                  "before the project stage runs; om project --reflect runs it now)")
    for r in view.reflections:
        out.file.write(f"[{r.id}] {r.content}\n")
        out.print(f"  [dim]rests on {', '.join(r.supportingIds)}[/]", highlight=False)
    if view.retired:
        out.print(f"[dim]{len(view.retired)} retired (--json lists them with why)[/]")
    if view.offline and view.reflections:
        from flows.cli.memory import OFFLINE_MEMORY

        err.print(OFFLINE_MEMORY, highlight=False)


def _reflect(ws: Workspace, path: str | None, model: str | None, api_base: str | None, as_json: bool) -> None:
    from flows.cli.common import model_config
    from om_core.project.stage import run_project_stages
    from om_core.store.repository import resolve_project
    from om_core.workers.run_config import make_brain

    config = model_config(ws.settings, model, api_base, as_json)
    with ws.read() as con:
        project_id = resolve_project(con, path, ws.settings.projects).project_id
    with ws.one_writer("project reflect"):
        outcomes = run_project_stages(ws, project_id, make_brain(config, ws.settings), force=True)
    if as_json:
        print_json({"project_id": project_id, "stages": [o.as_json() for o in outcomes], "offline": config.offline})
    else:
        if not outcomes:
            out.print(f"{escape(project_id)}: nothing new since the project stage last read its sessions")
        for o in outcomes:
            what = (f"{len(o.reflections)} reflection(s), {len(o.retirements)} retired" if o.outcome == "recorded"
                    else o.error or o.reason or o.outcome)
            out.print(escape(f"{project_id}: {o.outcome}: {what} (from {o.inputs} line(s) of session memory)"),
                      highlight=False)
    if any(o.outcome == "failed" for o in outcomes):
        raise typer.Exit(1)


@app.command(epilog=examples('om search ERR_CONN_4417', 'om search "retry backoff" --project .',
                            'om search upload.py --session SESSION --json'))
def search(
    query: str = typer.Argument(..., metavar="QUERY", help="Words, identifiers or paths to look for."),
    project: Optional[str] = typer.Option(None, "--project", help="Only this project (a folder, id or name): its "
                                          "sessions' memory and entries, and its project memory."),
    session: Optional[str] = typer.Option(None, "--session", help="Only this session (id, prefix or file path)."),
    limit: int = typer.Option(20, "--limit", min=1, help="Hits to show at most."),
    kind: Optional[list[SearchKind]] = typer.Option(
        None, "--kind", help="Only hits of this kind (repeatable): observation, reflection, entry, "
        "project_reflection."),
    as_json: bool = typer.Option(False, "--json", help="Print the hits as JSON."),
) -> None:
    """Search observations, reflections, source entries and project memory, best first (BM25).

    Each hit has its memory id (om recall ID gives its evidence) and where it comes from: an
    observation's source entries, a reflection's supporting observations' entries, or the entry itself
    with the observations citing it. An exact identifier (ERR_CONN_4417, src/upload.py:42, v1.2.3) is a
    term of its own, so the texts holding it rank above those that only share its words. Forgotten ids
    (om forget) are left out."""
    from om_core.recall.search import hit_places
    from om_core.recall.search import search as run_search

    if project is not None and session is not None:
        raise InvalidArgument("choose one of --project and --session")
    result = run_search(workspace(), query, project=project, session=session, limit=limit, kinds=kind)
    if as_json:
        print_json(result.as_json())
        return
    if result.unindexed:
        err.print(f"{result.unindexed} document(s) are not indexed yet (another process is writing); they are "
                  "searched once it is done")
    if not result.hits:
        err.print(f"nothing matches {query!r}")
        raise typer.Exit(1)
    for hit, place in zip(result.hits, hit_places(workspace(), result.hits)):
        for line in hit_block(hit, place, query, text_width()):
            out.print(escape(line), highlight=False, soft_wrap=True)


def hit_block(hit: SearchHit, place: HitPlace, query: str, width: int) -> list[str]:
    """One hit as a block a terminal of ``width`` columns shows whole: a header line (rank, kind, where
    it comes from, its id, its time), then the match in context wrapped below it, then a blank line."""
    from om_core.recall.search import snippet

    what = hit.memory_id or f"entry {hit.entry_id}"
    if hit.memory_ids and not hit.memory_id:
        what += f" (cited by {', '.join(hit.memory_ids[:3])}{' …' if len(hit.memory_ids) > 3 else ''})"
    header = " · ".join(part for part in (f"{hit.rank}. {hit.kind}", place.label, what, place.time) if part)
    indent = "   "
    body = textwrap.wrap(snippet(hit.text, query, width=max(40, 3 * (width - len(indent)))),
                         width=max(20, width - len(indent)), max_lines=3, placeholder=" …",
                         break_long_words=True, break_on_hyphens=False)
    return [*textwrap.wrap(header, width=width, subsequent_indent=indent, break_long_words=True),
            *(indent + line for line in body), ""]


@app.command(epilog=examples('om forget 3f9a0c1b2d4e --reason "it names a customer"',
                            'om forget 3f9a0c --session SESSION --reason "wrong"',
                            'om forget 7d1e22aa90b3 --project --reason "no longer true" --json'))
def forget(
    memory_id: str = typer.Argument(..., metavar="ID", help="A memory id (observation, reflection, project "
                                    "reflection), or a unique prefix of one."),
    reason: str = typer.Option(..., "--reason", help="Why: kept with the forget (drops.reason)."),
    session: Optional[str] = typer.Option(None, "--session", help="Only in this session (default: every session "
                                          "and project recording the id)."),
    in_project: bool = typer.Option(False, "--project", help="Only in project memory (a project reflection)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was recorded as JSON."),
) -> None:
    """Forget a memory id: an append-only retirement with your reason, never a deletion.

    In each session recording the id, a drop record of origin user; in each project whose memory holds
    it, a retirement record. From then on the id is in no fold, projection, compaction (om view, om
    compact, om export --compact, the live compaction), worker input, project memory or search hit;
    the source entries stay, and om recall still shows the evidence, marked forgotten."""
    from om_core.usecases.forget import forget as run_forget

    ws = workspace()
    with ws.one_writer("forget"):
        result = run_forget(ws, memory_id, reason, session=session, project=in_project)
    if as_json:
        print_json(result.as_json())
        return
    for f in result.recorded:
        out.print(escape(f"forgot {result.id} in {f.scope} {f.scope_id} (record {f.ledger_id})"), highlight=False)
    for f in result.already:
        out.print(escape(f"{result.id} was forgotten in {f.scope} {f.scope_id} already"), highlight=False)


__all__ = ["project", "search", "forget"]
