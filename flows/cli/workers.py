"""`om observe`, `om reflect`: one memory worker stage now, in this process (no orchestrator); `om logs`:
the model calls the workers made."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.markup import escape

from flows.cli.common import (
    ApiBaseOpt,
    ModelOpt,
    SessionArg,
    app,
    err,
    examples,
    model_config,
    out,
    print_json,
    print_rows,
    workspace,
)


def _print_stage(outcome, as_json: bool) -> None:
    if as_json:
        return
    if outcome.outcome == "skipped":
        out.print(f"{outcome.stage}: nothing to do ({outcome.reason})")
    elif outcome.outcome == "failed":
        err.print(f"[red]{outcome.stage} failed[/] ({outcome.error_kind}): {escape(str(outcome.error))}",
                  highlight=False)
    elif outcome.outcome == "empty":
        out.print(f"{outcome.stage}: recorded nothing (deliberately empty; {outcome.rejected} rejected)")
    else:
        extra = f", {outcome.duplicates} duplicate(s)" if outcome.duplicates else ""
        out.print(f"{outcome.stage}: appended {outcome.items} item(s) as record {outcome.ledger_id} "
                  f"(covers up to {outcome.covers_up_to_id}; {outcome.rejected} rejected{extra})")
    if outcome.turn_cap_reached:
        err.print(f"[yellow]{outcome.stage} stopped at the turn cap ({outcome.turns} model calls)[/]")


def _finish(outcomes, as_json: dict | None) -> None:
    """Print the stages' outcomes (or the JSON given), exit 1 when one failed."""
    if as_json is not None:
        print_json(as_json)
    for outcome in outcomes:
        _print_stage(outcome, as_json is not None)
    if any(o.outcome == "failed" for o in outcomes):
        raise typer.Exit(1)


def _stage_setup(model: Optional[str], api_base: Optional[str], as_json: bool):
    ws = workspace()
    return ws, model_config(ws.settings, model, api_base, as_json)


@app.command(epilog=examples('om observe SESSION', 'om observe SESSION --model openai/gpt-4o-mini'))
def observe(
    session: SessionArg,
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Observe the branch ending at this entry."),
    model: ModelOpt = None,
    api_base: ApiBaseOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print the stage outcome as JSON."),
) -> None:
    """Run one observer stage now on the oldest uncovered chunk, even below the threshold."""
    from om_core.replay.stage_runner import observe_now

    ws, config = _stage_setup(model, api_base, as_json)
    with ws.one_writer("observe"):
        outcome = observe_now(ws, session, leaf, config)
    _finish([outcome], {**outcome.as_json(), "offline": config.offline} if as_json else None)


@app.command(epilog=examples('om reflect SESSION', 'om reflect SESSION --model anthropic/claude-sonnet-4-5 --json'))
def reflect(
    session: SessionArg,
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Reflect on the branch ending at this entry."),
    model: ModelOpt = None,
    api_base: ApiBaseOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print the stage outcomes as JSON."),
) -> None:
    """Run the reflector now, then the dropper if it added reflections and the pool is over target."""
    from om_core.replay.stage_runner import reflect_now

    ws, config = _stage_setup(model, api_base, as_json)
    with ws.one_writer("reflect"):
        outcomes = reflect_now(ws, session, leaf, config)
    _finish(outcomes, {"stages": [o.as_json() for o in outcomes], "offline": config.offline} if as_json else None)


@app.command(epilog=examples(
    "om logs",
    "om logs --session 0b5e --stage observer --limit 5",
    "om logs --full --limit 1",
    "om logs --json --full --limit 0 > calls.json",
))
def logs(
    session: Optional[str] = typer.Option(None, "--session", help="Only this session (id, unique prefix, or "
                                          "ingested file path)."),
    stage: Optional[str] = typer.Option(None, "--stage", help="Only this stage: observer, reflector or dropper."),
    limit: int = typer.Option(20, "--limit", "-n", min=0, help="How many calls, newest first (0: all)."),
    full: bool = typer.Option(False, "--full", help="Also each call's request as sent (after redaction) and its "
                              "response."),
    as_json: bool = typer.Option(False, "--json", help="Print an array of call objects."),
) -> None:
    """The model calls, newest first: time, session, stage, model, status, tokens (input, output,
    cached), cost and latency. Request and response texts are kept unless storePrompts is off."""
    from om_core.model.logs import model_call_log

    calls = model_call_log(workspace(), session=session, stage=stage, limit=limit, full=full)
    if as_json:
        print_json([c.model_dump(mode="json", exclude=None if full else {"request", "response", "text_stored"})
                    for c in calls])
        return
    if not calls:
        err.print("no model calls recorded" + (" for these filters" if session or stage else ""))
        return
    if full:
        for c in calls:
            _print_call_text(c)
        return
    rows = []
    for c in calls:
        status = c.status if c.status == "ok" else f"{c.status} ({c.error_kind})"
        rows.append([c.started_at.strftime("%Y-%m-%d %H:%M:%S"), c.session_id or "", c.stage or "", c.model, status,
                     *("" if v is None else str(v) for v in (c.input_tokens, c.output_tokens, c.cached_tokens)),
                     "" if c.cost is None else f"${c.cost:.4f}", f"{c.latency_ms:.0f}"])
    print_rows(["time", "session", "stage", "model", "status", "in", "out", "cached", "cost", "ms"], rows,
               wrap={"time", "status"}, short={"session"}, drop=["cached", "ms", "model"])


def _print_call_text(c) -> None:
    """One call as text: a header line, the messages sent, the reply (written as they are, not wrapped)."""
    write = sys.stdout.write
    tokens = "/".join("-" if v is None else str(v) for v in (c.input_tokens, c.output_tokens, c.cached_tokens))
    write(f"## {c.started_at:%Y-%m-%d %H:%M:%S} {c.session_id or ''} {c.stage or ''} turn {c.turn} "
          f"attempt {c.attempt} {c.status} {c.model} tokens {tokens} (in/out/cached) "
          f"{'' if c.cost is None else f'${c.cost:.4f} '}{c.latency_ms:.0f} ms call {c.call_id}\n")
    if c.error:
        write(f"error: {c.error}\n")
    if not c.text_stored:
        write("(no text stored for this call)\n\n")
        return
    for m in c.request.get("messages", []):
        write(f"--- {m.get('role')}{' ' + m['tool_call_id'] if m.get('tool_call_id') else ''}\n")
        content = m.get("content")
        if content:
            write((content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)) + "\n")
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            write(f"[tool call {fn.get('name')}] {fn.get('arguments')}\n")
    names = [t.get("function", {}).get("name") for t in c.request.get("tools", [])]
    if names:
        write(f"--- tools: {', '.join(str(n) for n in names)}\n")
    if c.response is not None:
        write("--- response\n")
        if c.response.get("content"):
            write(c.response["content"] + "\n")
        for call in c.response.get("tool_calls", []):
            write(f"[tool call {call.get('name')}] {call.get('arguments')}\n")
    write("\n")
    sys.stdout.flush()
