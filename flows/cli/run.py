"""`om run`: the Prefect pipeline on the local Prefect server om keeps between runs (flows.kept_server) or
the user's PREFECT_API_URL (ingest, replay, compactions, drain), with a
live board on a terminal, the cost estimate before and the real cost after.

Prefect, rich.live and the run's planning (ingest, pyarrow) are imported inside the command (Prefect
after ``prepare_environment``), for the speed of every other command.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.markup import escape
from rich import box
from rich.table import Table

from flows import progress
from flows.cli.common import (ApiBaseOpt, ExcludeOpt, ModelOpt, announce_model, app, counted, err, examples,
                              model_config, out, print_json, print_rows, workspace)
from flows.cli.run_lines import ProgressLines
from flows.interrupt import RunInterrupted, run_interruptibly, say_and_exit
from flows.limits import run_guards
from flows.preflight import check_cluster_run, check_credential
from flows.run_result import RunReport, RunResult, SessionRow
from flows.runner import prepare_environment, run_pipeline
from om_core.store.db import new_run_id
from om_core.errors import InvalidArgument, StopReason

if TYPE_CHECKING:
    from om_core.model.cost import CostBudget, RunEstimate
    from om_core.replay.plan import RunPlan
    from om_core.store.workspace import Workspace
    from om_core.workers.run_config import ModelConfig, RunGuards


@app.command(epilog=examples(
    'om run ~/.pi/agent/sessions', 'om run session.jsonl --model openai/gpt-4o-mini --concurrency 2',
    'om run SESSION --model offline --json'))
def run(
    targets: list[str] = typer.Argument(..., help="Session files, directories, or ingested session ids."),
    exclude: ExcludeOpt = None,
    model: ModelOpt = None,
    api_base: ApiBaseOpt = None,
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="Sessions processed in parallel."),
    no_drain: bool = typer.Option(False, "--no-drain", help="Live sessions: do not drain branches at their end."),
    runner: str = typer.Option("threads", "--task-runner", help="threads, or dask (a local cluster, or --dask-address)."),
    model_limit: Optional[str] = typer.Option(
        None, "--model-limit", help="How the model-call limit (modelConcurrency) is shared: 'process' (this "
        "process; the default for local runs) or 'prefect' (Prefect's global concurrency limit; the default with "
        "--dask-address)."),
    dask_address: Optional[str] = typer.Option(None, "--dask-address", help="Scheduler of a running Dask cluster."),
    verbose: bool = typer.Option(False, "--verbose", help="Show Prefect's own logs."),
    max_cost: Optional[float] = typer.Option(
        None, "--max-cost", min=0, metavar="USD",
        help="Stop before a model call could take this run's cost past USD (litellm's price of the model; each "
        "call's worst case is reserved first). Nothing half-done is kept: rerun to resume. Exit code 4 when it "
        "stopped the run."),
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
) -> None:
    """Process sessions with the Prefect pipeline: ingest, replay every branch with the memory workers
    when their clocks are due, simulate compactions, drain.

    Without PREFECT_API_URL the run uses the local Prefect server an earlier run left (127.0.0.1 only,
    locked with a credential of its own), or starts one and leaves it for the next runs: it stops after
    prefectServerIdleSeconds without a run (`om server status|stop`; 0: a temporary API per run).

    With a model litellm has a price for, the estimated cost is printed before the run (source
    tokens still to observe × the prompt ratio bench/cost/workers.py measured) and the real cost (from
    the provider's usage) after it.

    Sessions unchanged since their last complete replay (same settings and model) are skipped, so a
    rerun of a finished archive starts nothing. Ctrl-C (or SIGTERM) stops the run within seconds;
    rerunning the same command resumes it without repeating a model call already made."""
    if runner not in ("threads", "dask"):
        raise InvalidArgument(f"unknown --task-runner {runner!r}: use threads or dask")
    if dask_address:
        runner = "dask"  # an address names a Dask cluster: no other runner can use it
    from om_core.replay.plan import check_targets, ingest_targets, plan_run  # for speed, see above

    ws = workspace()
    settings = ws.settings
    if dask_address:  # before any work (no database opened): workers elsewhere need a server and shared results
        check_cluster_run(dask_address, os.environ.get("PREFECT_API_URL"), settings.resultStorage)
    elif os.environ.get("PREFECT_API_URL"):  # a server the user runs: one line, not Prefect's 401 traceback
        check_credential(os.environ["PREFECT_API_URL"])
    limit = model_limit or ("prefect" if dask_address else "process")
    if limit not in ("process", "prefect"):
        raise InvalidArgument("--model-limit must be 'process' or 'prefect'")
    # the run's one ModelConfig, built here from the settings and carried to the flow as that value
    # (checked now, announced once the targets are: a missing path is the one line `om run /missing` prints)
    config = model_config(settings, model, api_base, as_json, announce=False, limit=limit, max_cost=max_cost)
    # piped, a missing target stays the one line it prints: the run's progress lines start with the replay
    say = (lambda text: None) if as_json or not err.is_terminal else (lambda text: err.print(text, highlight=False))
    if _no_session_files(targets, exclude):  # nothing to read: no database, no lock file, no replay claimed
        if as_json:
            print_json(RunReport(run_id=None, sessions=[], errors=[], failures=[], skipped=[], database=str(ws.path),
                                 offline=config.offline, session_files=0).as_json())
        else:
            out.print(escape(f"no Pi session files (*.jsonl) in {', '.join(targets)}: nothing to ingest or "
                             "replay"), highlight=False)
        return
    with ws.one_writer("run"):  # from before the plan's ingest to the last commit: a second run gets exit 3
        say("checking the targets and ingesting new lines…")
        checked = check_targets(ws, targets)
        plan = plan_run(ws, checked, ingest_targets(ws, checked, exclude=exclude or ()), model=config.name,
                        drain=not no_drain)
        if not as_json:
            announce_model(config)
            for line in plan.warnings:  # a rewritten file that lost entries or the evidence of memory records
                err.print(f"[yellow]warning[/] {escape(line)}", highlight=False)
            for note in plan.notes:
                err.print(f"  [yellow]note[/] {escape(note)}", highlight=False)
        estimate, guards = None, None
        if settings.passive or not plan.due:  # nothing to replay: no orchestrator starts
            summary = RunResult(errors=list(plan.errors))
        else:
            estimate = _cost_estimate(ws, plan.due, config, max_cost, as_json)
            say(f"{len(plan.due)} of {len(plan.session_ids)} session(s) to replay; starting the orchestrator "
                "(Prefect)…")
            guards = run_guards(config, settings)  # the run's breaker, budget and call gate: one value
            summary = _run_with_display(ws, plan, config, guards, concurrency, not no_drain,
                                        runner, dask_address, as_json, verbose)
    skipped = plan.skipped if not settings.passive else list(plan.session_ids)
    with _one_reader(ws) as view:
        report = RunReport(run_id=summary.run_id, sessions=_run_rows(view, summary), errors=summary.errors,
                           failures=_run_failures(view, summary), skipped=skipped, passive=settings.passive,
                           cost=_run_cost(view, summary, max_cost, estimate,
                                          guards.budget if guards is not None else None),
                           projects=summary.projects, warnings=list(plan.warnings), notes=list(plan.notes),
                           database=str(ws.path), offline=config.offline)
    cost = report.cost
    if as_json:
        print_json(report.as_json())
    else:
        if summary.run_id is None and not plan.session_ids:
            out.print(escape(f"no session to replay in {ws.path}"), highlight=False)
        elif summary.run_id is None:
            why = ("passive is set: ingest only" if settings.passive else
                   "each is unchanged since its last complete replay")
            out.print(escape(f"{counted(len(plan.session_ids), 'session')} in {ws.path}, none to replay ({why})"),
                      highlight=False)
        else:
            _print_run_table(report)
            out.print(escape(f"memory in {ws.path}"), highlight=False)
            if config.offline:  # what it recorded copies, it does not understand: say so where it is shown
                out.print(OFFLINE_NOTE, highlight=False)
            for p in summary.projects:  # the project stages after the sessions
                why = p.get("error") or p.get("reason")
                out.print(escape(f"project {p.get('project_id', '?')}: {p['outcome']}"
                                 + (f", {len(p['reflections'])} reflection(s)" if p["outcome"] == "recorded" else "")
                                 + (f" ({why})" if why else "")), highlight=False)
        _print_failures(summary, report.failures)
        _print_cost(cost)
    if summary.errors or report.failures or any(s.error for s in summary.sessions):
        raise typer.Exit(1)
    if cost.get("stopped_by_max_cost"):
        raise typer.Exit(4)


OFFLINE_NOTE = ("memory by the offline baseline (extractive rules, no model): it copies what was said, "
                "it does not understand; run with --model for a model's memory")


@contextmanager
def _one_reader(ws: Workspace) -> Iterator[Workspace]:
    """The closing report's reads on one connection: each read of a file workspace opens the file, and
    an open costs more than the report's three small queries. Without a database (nothing ingested)
    the workspace itself, whose reads then fail as they did."""
    from om_core.store.workspace import ConnectionDatabase, Workspace

    with ExitStack() as stack:
        try:
            con = stack.enter_context(ws.read())
        except Exception:
            con = None
        yield ws if con is None else Workspace(ConnectionDatabase(con), ws.settings)


def _no_session_files(targets: list[str], exclude) -> bool:
    """Every target is an existing folder or file and no *.jsonl file is among them (a session id or a
    missing path is left to the plan, which names it)."""
    from om_core.ingest.files import discover
    from om_core.replay.plan import split_targets

    paths, ids, missing = split_targets(targets)
    return bool(paths) and not ids and not missing and not discover(paths, exclude or ())[0]


def _cost_estimate(ws: Workspace, targets: list[str], config: ModelConfig, max_cost: float | None,
                   as_json: bool) -> RunEstimate | None:
    """Print (and return) the run's estimated cost; --max-cost needs a model litellm can price."""
    if config.offline:
        if max_cost is not None:
            raise InvalidArgument("--max-cost needs a model (the offline baseline costs nothing)")
        return None
    from om_core.replay.plan import estimate_for_targets  # for speed, see above

    estimate, backlog = estimate_for_targets(ws, targets, config.model)
    if estimate.usd is None:  # a model litellm has no price for: no estimate to print
        if max_cost is not None:
            raise InvalidArgument(f"--max-cost needs the model's price, and litellm has none for {config.model!r}")
        return estimate
    if not as_json:
        basis = " (partly from file sizes)" if backlog.from_file_size else ""
        err.print(f"estimate: {backlog.source_tokens:,} source tokens to observe{basis} → about "
                  f"{estimate.prompt_tokens:,} prompt tokens ({estimate.uncached_tokens:,} uncached) and "
                  f"${estimate.usd:.4f} with {escape(config.model)}"
                  + (f"; stops before ${max_cost:.4f} (--max-cost)" if max_cost is not None else ""), highlight=False)
    return estimate


def _run_cost(ws: Workspace, summary: RunResult, max_cost: float | None, estimate: RunEstimate | None,
              budget: CostBudget | None) -> dict[str, Any]:
    """The run's real cost from the provider's usage, and whether --max-cost (the run's ``budget``) stopped it."""
    run_id = summary.run_id
    stopped = (budget is not None and budget.exhausted) or any(s.stop is StopReason.BUDGET for s in summary.sessions)
    try:
        [row] = ws.rows("run_cost", {"run_id": run_id})
    except Exception:  # no database (nothing ingested)
        row = {"model_calls": 0, "cost_usd": None}
    from flows.cli.costs import cost_status

    return {**row, "status": cost_status(row.get("model_calls") or 0, row.get("cost_usd"), row.get("unpriced_calls") or 0),
            "estimated_usd": None if estimate is None else estimate.usd, "max_cost": max_cost,
            "stopped_by_max_cost": bool(stopped)}


def _print_cost(cost: dict) -> None:
    from flows.cli.costs import cost_line

    line = cost_line(cost)
    if line is not None:
        err.print(("[yellow]" + escape(line) + "[/]") if cost.get("stopped_by_max_cost") else escape(line),
                  highlight=False)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def board_name(row: dict) -> str:
    """A session on the board: its short id (8 characters, what a SESSION argument takes), then its file
    name without what repeats the id (Pi names a file ``<time>_<session id>.jsonl``)."""
    from om_core.pi.session import file_label

    sid = row["session_id"]
    return f"{sid[:8]} {file_label(row.get('file') or '', sid)}".rstrip()


# The board's columns after the session: header, the row's value. Headers are never cut; "failed"
# appears once a stage failed, "last" where the terminal has room for it.
_BOARD_COLUMNS = (("state", lambda r: r["state"]), ("entry", lambda r: f"{r['position']}/{r['of']}"),
                  ("recorded", lambda r: str(r["recorded"])), ("model calls", lambda r: str(r["calls"])),
                  ("compactions", lambda r: str(r["compactions"])), ("failed", lambda r: str(r["failures"])),
                  ("last", lambda r: r["last"]))
_SESSION_MIN = 17  # the short id and 8 characters of the name


def board_table(rows: list[dict], elapsed: float, left: float | None, width: int | None = None) -> Table:
    """The live board: a row per session (its short id, then its file name), what its replay did so far
    (stages that recorded memory, model calls, compactions), the run's elapsed time and an estimate of
    what is left in the title. ``width``: the terminal's; the session column takes what the others
    leave, the name shortened at its end (never the id), and "last" is left out where it does not fit."""
    title = f"om run · {_clock(elapsed)} elapsed · " + ("estimating what is left" if left is None
                                                        else f"about {_clock(left)} left")
    columns = [(h, cell) for h, cell in _BOARD_COLUMNS if h != "failed" or any(r["failures"] for r in rows)]
    names = [board_name(r) for r in rows]

    def widths(cols) -> list[int]:
        return [max([len(h), *(len(cell(r)) for r in rows)]) for h, cell in cols]

    def room(cols) -> int:  # what the session column has: two spaces between columns, no borders
        return width - sum(widths(cols)) - 2 * len(cols)

    if width is not None and room(columns) < _SESSION_MIN:
        columns = [c for c in columns if c[0] != "last"]
    longest = max(map(len, names), default=0)
    session_width = longest if width is None else max(_SESSION_MIN, min(room(columns), longest))
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                  collapse_padding=True)
    table.add_column("session", no_wrap=True, overflow="ellipsis", width=max(session_width, len("session")))
    for (header, _), size in zip(columns, widths(columns)):
        numeric = header not in ("state", "entry", "last")
        table.add_column(header, no_wrap=True, justify="right" if numeric else "left", width=size)
    for row, name in zip(rows, names):
        table.add_row(escape(name), *(escape(cell(row)) for _, cell in columns))
    return table


class LiveBoard:
    """The board, drawn once the run has sessions on it: not while Prefect starts (an empty board then
    sat there for seconds and was left in the scrollback), and one Live for the whole run."""

    def __init__(self, console) -> None:  # noqa: ANN001 - a rich Console
        from rich.live import Live

        self.console = console
        self.live = Live(console=console, refresh_per_second=4, transient=True)
        self.started = False

    def table(self) -> Table | None:
        rows = progress.snapshot()
        if not rows:
            return None
        return board_table(rows, *progress.timing(rows), width=self.console.width)

    def tick(self) -> None:
        table = self.table()
        if table is None:
            return
        if not self.started:
            self.live.start()
            self.started = True
        self.live.update(table, refresh=True)

    def stop(self) -> None:
        if self.started:
            self.live.stop()


def _describe_sessions(ws: Workspace, session_ids: list[str]) -> None:
    """File names and entry counts for the board, read before Prefect starts."""
    rows = ws.rows("board_sessions", {"session_ids": list(session_ids)})
    progress.describe({r["session_id"]: {"file": Path(r["file_path"]).name if r["file_path"] else None,
                                         "entries": r["entry_count"]} for r in rows})


def _run_with_display(ws: Workspace, plan: RunPlan, config: ModelConfig, guards: RunGuards, concurrency: int,
                      drain: bool, runner: str, dask_address: str | None, quiet: bool, verbose: bool) -> RunResult:
    from flows.kept_server import api_for_run

    say = (lambda text: None) if quiet else (lambda text: err.print(escape(text), highlight=False))
    # the Prefect server an earlier run left (or one started now for the next runs), leased while this one runs
    with api_for_run(ws.settings.prefectServerIdleSeconds, say) as kept:
        return _run_on_api(ws, plan, config, guards, concurrency, drain, runner, dask_address, quiet, verbose,
                           heartbeats=kept is None)


def _run_on_api(ws: Workspace, plan: RunPlan, config: ModelConfig, guards: RunGuards, concurrency: int, drain: bool,
                runner: str, dask_address: str | None, quiet: bool, verbose: bool, heartbeats: bool) -> RunResult:
    """The flow on the API ``api_for_run`` chose; ``heartbeats=False`` on om's kept server (no automation
    there reads them: flows.runner.without_heartbeats)."""
    prepare_environment(verbose)  # before Prefect is imported
    run_id = new_run_id()
    _describe_sessions(ws, plan.due)

    def work():
        # planned once: the flow takes this plan (and the workspace's spec) as values, and plans nothing again
        return run_pipeline(list(plan.due), spec=ws.spec(), plan=plan, model=config, guards=guards,
                            concurrency=concurrency, drain=drain, runner=runner, dask_address=dask_address,
                            run_id=run_id, heartbeats=heartbeats)

    try:
        if quiet:
            return run_interruptibly(ws, run_id, guards, work)
        if not err.is_terminal:  # piped: a line as each session starts and ends, not a board to redraw
            return run_interruptibly(ws, run_id, guards, work, on_tick=ProgressLines(err).tick)
        board = LiveBoard(err)
        try:
            return run_interruptibly(ws, run_id, guards, work, on_tick=board.tick)
        finally:
            board.stop()
    except RunInterrupted as exc:  # not Prefect's shutdown: the flow's thread is abandoned
        say_and_exit(exc.interruption.stderr, exc.interruption.line, exc.interruption.exit_code)


def _run_failures(ws: Workspace, summary: RunResult) -> list[dict[str, Any]]:
    """The run's failed stages, grouped by stage, session and error."""
    if summary.run_id is None:
        return []
    return ws.rows("run_failures", {"run_id": summary.run_id})


def _print_failures(summary: RunResult, failures: list[dict[str, Any]]) -> None:
    """Under the closing table: the failed stages, then the run's errors, one line each. A run the
    circuit breaker stopped gets its one line only: every failure then has that one cause."""
    if failures and not summary.stopped:
        print_rows(["stage", "session", "error", "count"],
                   [[f["stage"], f["session_id"], f["error"], str(f["count"])] for f in failures],
                   fold={"error"}, title="failed stages", short={"session"}, console=err)
    for e in summary.errors:
        err.print(f"[red]error:[/] {escape(str(e))}", highlight=False)
    for s in summary.sessions:
        if s.error and not s.stopped:  # stopped: the run's one error line says why
            err.print(f"[red]session {escape(s.session_id)} failed:[/] {escape(str(s.error))}", highlight=False)


def _run_rows(ws: Workspace, summary: RunResult) -> list[SessionRow]:
    ids = [s.session_id for s in summary.sessions]
    if not ids or summary.run_id is None:
        return []
    errors = {s.session_id: s.error for s in summary.sessions}
    return [SessionRow(**row, error=errors.get(row["session_id"]))
            for row in ws.rows("run_summary", {"run_id": summary.run_id, "session_ids": ids})]


def _print_run_table(report: RunReport) -> None:
    """The closing table: a row per session of ``report`` (what ``--json`` prints), then the total."""
    from flows.cli.costs import cost_cell
    from om_core.pi.session import file_label

    counts = ("observations", "reflections", "drops", "compactions", "model_calls", "tokens")
    totals = {k: 0 for k in (*counts, "errors", "unpriced_calls")}
    cost = 0.0
    body = []
    for r in report.sessions:
        for k in totals:
            totals[k] += getattr(r, k) or 0
        cost += r.cost or 0
        body.append([r.session_id, file_label(Path(r.file or "").name, r.session_id) or "",
                     *(str(getattr(r, k)) for k in counts),
                     cost_cell(r.model_calls or 0, r.cost, r.unpriced_calls or 0),
                     str(r.errors) + (" + session error" if r.error else "")])
    priced = any(r.cost is not None for r in report.sessions)
    body.append(["total", "", *(str(totals[k]) for k in counts),
                 cost_cell(totals["model_calls"], cost if priced else None, totals["unpriced_calls"]),
                 str(totals["errors"])])
    print_rows(["session", "file", "observations", "reflections", "drops", "compactions", "model calls", "tokens",
                "cost", "errors"], body, title=f"run {report.run_id}", short={"session"},
               drop=["tokens", "model calls", "cost", "drops"], bold_last=True)
    if report.skipped:
        out.print(f"{len(report.skipped)} more session(s) unchanged since their last replay: skipped", highlight=False)
