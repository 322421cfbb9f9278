"""`om observe`, `om reflect`: one memory worker stage now, in this process (no orchestrator)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from flows.cli.common import API_BASE_HELP, MODEL_HELP, SESSION_HELP, app, err, examples, model_config, out, print_json, workspace


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


def _stage_setup(model: Optional[str], api_base: Optional[str], as_json: bool):
    ws = workspace()
    return ws, model_config(ws.settings, model, api_base, as_json)


@app.command(epilog=examples('om observe SESSION', 'om observe SESSION --model openai/gpt-4o-mini'))
def observe(
    session: str = typer.Argument(..., help=SESSION_HELP),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Observe the branch ending at this entry."),
    model: Optional[str] = typer.Option(None, "--model", envvar="OM_MODEL", help=MODEL_HELP),
    api_base: Optional[str] = typer.Option(None, "--api-base", envvar="OM_API_BASE",
                                           help=API_BASE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the stage outcome as JSON."),
) -> None:
    """Run one observer stage now on the oldest uncovered chunk, even below the threshold."""
    from om_core.workers.stages import observe_now

    ws, config = _stage_setup(model, api_base, as_json)
    outcome = observe_now(ws, session, leaf, config)
    if as_json:
        print_json({**outcome.as_json(), "offline": config.offline})
    _print_stage(outcome, as_json)
    if outcome.outcome == "failed":
        raise typer.Exit(1)


@app.command(epilog=examples('om reflect SESSION', 'om reflect SESSION --model anthropic/claude-sonnet-4-5 --json'))
def reflect(
    session: str = typer.Argument(..., help=SESSION_HELP),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Reflect on the branch ending at this entry."),
    model: Optional[str] = typer.Option(None, "--model", envvar="OM_MODEL", help=MODEL_HELP),
    api_base: Optional[str] = typer.Option(None, "--api-base", envvar="OM_API_BASE",
                                           help=API_BASE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the stage outcomes as JSON."),
) -> None:
    """Run the reflector now, then the dropper if it added reflections and the pool is over target."""
    from om_core.workers.stages import reflect_now

    ws, config = _stage_setup(model, api_base, as_json)
    outcomes = reflect_now(ws, session, leaf, config)
    if as_json:
        print_json({"stages": [o.as_json() for o in outcomes], "offline": config.offline})
    for outcome in outcomes:
        _print_stage(outcome, as_json)
    if any(o.outcome == "failed" for o in outcomes):
        raise typer.Exit(1)
