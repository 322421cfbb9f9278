"""`om eval …`: the command line of evaluations (a typer sub-app that flows.cli.main mounts).

Only typer and rich are imported here; the evaluation (litellm, DuckDB work) is imported inside the
command, so `om --help` stays fast.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from flows.cli.common import err, out, workspace

eval_app = typer.Typer(name="eval", help="Measure memory quality on public benchmarks.", no_args_is_help=True,
                       epilog="Examples:\n  om eval longmemeval --data longmemeval_s_cleaned.json --model offline "
                       "--reader openai/gpt-4o-mini --limit 20",
                       add_completion=False, pretty_exceptions_enable=False)


def _split(value: Optional[str]) -> Optional[list[str]]:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


@eval_app.command("longmemeval", epilog="Examples:\n"
                  "  om eval longmemeval --data longmemeval_s_cleaned.json --model openai/gpt-4o-mini "
                  "--reader openai/gpt-4o\n"
                  "  om eval longmemeval --data longmemeval_s_cleaned.json --model offline --reader openai/gpt-4o-mini "
                  "--conditions om,full --limit 20 --json")
def longmemeval(
    data: Path = typer.Option(..., "--data", help="The LongMemEval JSON you downloaded (e.g. "
                              "longmemeval_s_cleaned.json); nothing is fetched at run time."),
    model: Optional[str] = typer.Option(None, "--model", envvar="OM_MODEL",
                                        help="Model of the memory workers, needed for the om condition: a litellm "
                                        "model string, or 'offline' for the extractive baseline (default: the "
                                        "configured model)."),
    reader: str = typer.Option(..., "--reader", help="Model that answers the questions (and writes the native summary)."),
    judge: Optional[str] = typer.Option(None, "--judge", help="Model of the built-in approximate judge (default: the "
                                        "reader); 'off' to only write hypotheses."),
    conditions: str = typer.Option("om,oracle,native,full", "--conditions",
                                   help="Comma-separated: om, oracle, native, full."),
    types: Optional[str] = typer.Option(None, "--types", help="Only these question types (comma-separated)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N instances (after --types)."),
    out_dir: Path = typer.Option(Path("longmemeval-out"), "--out", help="Output folder (reused by a rerun)."),
    api_base: Optional[str] = typer.Option(None, "--api-base", envvar="OM_API_BASE",
                                           help="Base URL of an OpenAI-compatible server, for every model."),
    reader_recall: bool = typer.Option(False, "--reader-recall", help="om: give the reader a recall tool over the ledger."),
    reader_window: Optional[int] = typer.Option(None, "--reader-window", min=1024,
                                                help="Reader's context window in tokens (default: litellm's model "
                                                "card, else 128000)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1,
                                              help="Instances worked on at once (default: modelConcurrency)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Run LongMemEval under the om, oracle, native and full conditions; write the official
    hypotheses JSONL per condition, an approximate built-in grade, report.json and report.html.
    A rerun with the same --out finishes what is missing and reuses what is done; Ctrl-C stops
    cleanly."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from om_core.eval.run import EvalOptions

    settings = workspace().settings  # --config and the other sources; the evaluation has its own database
    if model is None and settings.model is not None:  # the workers' model, as `om run` takes it
        model = settings.model.litellm_name
    options = EvalOptions(data=data, out=out_dir, model=model, reader=reader, judge=judge,
                          conditions=_split(conditions) or [], types=_split(types), limit=limit, api_base=api_base,
                          reader_recall=reader_recall, reader_window=reader_window, concurrency=concurrency,
                          settings=settings)
    stop = threading.Event()
    summary = _run_with_progress(options, stop, quiet=as_json)
    report = summary.report
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
    else:
        _print_report(report, summary)
    if summary.interrupted:
        err.print("[yellow]interrupted[/]: what was done is kept; run the same command again to finish")
        raise typer.Exit(130)
    if summary.failures:
        raise typer.Exit(1)


def _run_with_progress(options, stop: threading.Event, quiet: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from om_core.eval.run import run_longmemeval

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.fields[note]}"), console=err, transient=True,
                        disable=quiet or not err.is_terminal)
    bars: dict[str, int] = {}
    failed: dict[str, int] = {}

    def on_event(event: dict) -> None:
        if event["event"] == "start":
            for condition in event["conditions"]:
                bars[condition] = progress.add_task(condition, total=event["questions"],
                                                    completed=event["done"].get(condition, 0), note="")
            if event["invalid"]:
                err.print(f"[yellow]{event['invalid']} invalid instance(s) skipped[/] (see invalid.jsonl)")
        elif event["event"] == "task":
            condition = event["condition"]
            if event["status"] in ("answered", "skipped"):
                progress.advance(bars[condition])
            elif event["status"] == "failed":
                failed[condition] = failed.get(condition, 0) + 1
                progress.update(bars[condition], note=f"[red]{failed[condition]} failed[/]")
        elif event["event"] == "stopping":
            err.print("[yellow]stopping: running tasks end at their next step…[/]")

    # Ctrl-C: the first asks the run to stop (running tasks end at their next step); a second one
    # quits at once, like a kill: every line and ledger record written so far is whole and kept.
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):  # noqa: ANN001
        if stop.is_set():
            err.print("[yellow]quit[/]: run the same command again to finish")
            os._exit(130)
        stop.set()
        err.print("[yellow]stopping: running tasks end at their next step (Ctrl-C again to quit now)…[/]")

    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        with progress:
            return run_longmemeval(options, progress=on_event, stop=stop)
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)


def _pct(value) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _print_report(report: dict, summary) -> None:
    conds = report["conditions"]
    table = Table("", *conds, title=f"LongMemEval ({report['questions']} questions)")
    scored = {c: v["scores"] for c, v in conds.items()}
    if any(scored.values()):
        table.add_row("mean of type averages", *(_pct(s and s["mean_of_type_averages"]) for s in scored.values()))
        table.add_row("per-question average", *(_pct(s and s["per_question_average"]) for s in scored.values()))
        types = list(dict.fromkeys(t for s in scored.values() if s for t in s["by_type"]))
        for t in types:
            table.add_row(f"  {t}", *(_pct(s["by_type"][t]["accuracy"]) if s and t in s["by_type"] else "–"
                                      for s in scored.values()))
        table.add_row("  abstention", *(_pct(s and s["abstention"]["accuracy"]) for s in scored.values()))
    table.add_row("answered/skipped/missing", *(f"{v['answered']}/{v['skipped']}/{v['missing']}" for v in conds.values()))
    table.add_row("model calls", *(str(v["usage"]["total"]["calls"]) for v in conds.values()))
    table.add_row("tokens in/out", *(f"{v['usage']['total']['input_tokens']:,}/{v['usage']['total']['output_tokens']:,}"
                                    for v in conds.values()))
    table.add_row("cost", *("–" if v["usage"]["total"]["cost"] is None else f"${v['usage']['total']['cost']:.4f}"
                            for v in conds.values()))
    table.add_row("time per question", *(f"{v['wall_seconds']['per_question'] or 0:.2f} s" for v in conds.values()))
    out.print(table)
    if report.get("judge"):
        err.print(f"[dim]scores: {escape(report['judge_note'])}[/]")
    json_path, html_path = summary.report_paths
    out.print(f"wrote {escape(str(json_path))} and {escape(str(html_path))}; hypotheses in "
              f"{escape(str(json_path.parent))}/CONDITION/hypotheses.jsonl", highlight=False)
    for row in summary.failures[:10]:
        err.print(f"[red]failed[/] {escape(row['condition'])} {escape(row['question_id'])}: {escape(row['error'])}",
                  highlight=False)
    if len(summary.failures) > 10:
        err.print(f"[red]… and {len(summary.failures) - 10} more failures[/] (report.json lists them)")
