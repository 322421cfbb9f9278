"""`om view`, `om compact`, `om recall`, `om status`: the memory of one session, read-only and
model-free (these import neither litellm nor Prefect)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from flows.cli.common import SessionArg, app, err, examples, out, print_json, print_rows, workspace
from om_core.errors import InvalidArgument


# Wherever the offline baseline's memory is shown: it copies what was said, it does not understand.
OFFLINE_MEMORY = ("[yellow]note:[/] this memory was written by the offline baseline (extractive rules, no model): "
                  "excerpts of what was said, not a model's understanding; om run --model MODEL replaces it")


@app.command(epilog=examples('om view SESSION', 'om view SESSION --full', 'om view SESSION --leaf ID --json'))
def view(
    session: SessionArg,
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Any entry id: memory as of that point on its branch."),
    full: bool = typer.Option(False, "--full", help="Full memory at the tip (the whole ledger), not visible memory."),
    replayed: bool = typer.Option(False, "--replayed", help="The replayed view: the latest folded compaction "
                                  "including the replay's simulated ones (what the extension would have shown)."),
    as_json: bool = typer.Option(False, "--json", help='Print {"observations": [...], "reflections": [...]}.'),
) -> None:
    """Show visible memory (the latest om.folded compaction the session file holds: what the agent saw),
    full memory (--full), or the replayed view of simulated compactions (--replayed).

    When the session file holds no visible memory (Pi with the extension never compacted it), the
    text form shows the replayed view, else full memory, and says which on stderr; --json keeps to
    the view asked for."""
    from om_core.memory.views import view as memory_view

    ws = workspace()
    result = memory_view(ws, session, leaf, full, replayed)
    if as_json:
        print_json(result.memory.wire())
        return
    summary = result.memory.summary()
    if summary is None and not (full or replayed):  # nothing visible: show what exists, labelled
        if result.replayedCounts and any(result.replayedCounts):
            err.print("the session file holds no memory the agent saw on this branch: showing the replayed view",
                      highlight=False)
            result = memory_view(ws, session, leaf, replayed=True)
        elif result.fullCounts and any(result.fullCounts):
            err.print("the session file holds no memory the agent saw on this branch, and no compaction folded "
                      "any: showing full memory (the whole ledger at the tip; om view --full)", highlight=False)
            result = memory_view(ws, session, leaf, full=True)
        summary = result.memory.summary()
    if result.offline and summary is not None:
        err.print(OFFLINE_MEMORY, highlight=False)
    if result.which == "replayed" and result.compaction is not None:
        source = "simulated" if result.compaction.origin == "simulated" else "the session file's own"
        err.print(f"replayed memory ({source} compaction {result.compaction.compaction_id}): what the extension "
                  "would have shown, not what the agent saw")
    if summary is None:
        what = {"full": "full memory", "replayed": "replayed memory (no folded compaction, simulated or not, on "
                "this branch)", "visible": "visible memory"}[result.which]
        err.print(f"{what} is empty at {result.tip}")
        if result.which == "visible":
            err.print("the session file holds no om.folded compaction on this branch" if result.compaction is None
                      else f"its latest om.folded compaction {result.compaction.compaction_id} holds no items")
            if result.fullCounts and any(result.fullCounts):
                err.print(f"full memory holds {result.fullCounts[0]} observation(s) and {result.fullCounts[1]} "
                          "reflection(s): om view --full")
            if result.replayedCounts and any(result.replayedCounts):
                err.print(f"the replay's simulated compactions show {result.replayedCounts[0]} observation(s) and "
                          f"{result.replayedCounts[1]} reflection(s): om view --replayed")
        return
    sys.stdout.write(summary + "\n")


@app.command(epilog=examples(
    'om compact SESSION', 'om compact SESSION --first-kept ID --gap-safe', 'om compact SESSION --json',
    'om compact SESSION --replayed'))
def compact(
    session: SessionArg,
    first_kept: Optional[str] = typer.Option(None, "--first-kept", help="F: the first entry Pi keeps verbatim "
                                             "(default: Pi's own cut point)."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Compact as of this entry (default: current leaf)."),
    pool_max: Optional[int] = typer.Option(None, "--pool-max", min=1, help="observationsPoolMaxTokens (default: the "
                                           "setting, 20000 unless configured)."),
    gap_safe: bool = typer.Option(False, "--gap-safe", help="The live hook's gap-free compaction: F moved back to "
                                  "the first entry no observation covers (no raw message lost), or declined when "
                                  "that keeps over compactionMaxRetainedTokens or frees nothing."),
    replayed: bool = typer.Option(False, "--replayed", help="The replayed world: the replay's simulated "
                                  "compactions count too (what the extension would have folded had it lived "
                                  "the session), like `om view --replayed`."),
    as_json: bool = typer.Option(False, "--json", help="Print world, fullFold, ids, summary and the om.folded details."),
) -> None:
    """The compaction the ledger gives at F (the first entry Pi keeps): deterministic and model-free.

    By default in the session file's world: only the compactions the file holds (Pi's and the
    extension's om.folded ones) count, so this is what the extension folds on the file `om export`
    writes. With --replayed the replay's simulated compactions count too (labelled replayed).
    Without --first-kept, F is Pi's own cut point (as `om cutpoint` shows), and the command says so.
    F may be one of om's records (an entry of the exported file Pi can keep first).
    """
    from om_core.store.catalog import cut_point
    from om_core.pi.cutpoint import DEFAULT_RULES
    from om_core.memory.gap_free_compaction import gap_free_compaction
    from om_core.memory.compaction import DeclineReason, compact as run_compact
    from om_core.memory.views import session_offline

    ws = workspace()
    settings = ws.settings
    cut = None
    if first_kept is None:
        cut = cut_point(ws, session, leaf, rules=DEFAULT_RULES)  # Pi 1.6's rules, whatever cutPointRules says
        first_kept = cut.firstKeptEntryId
        if not as_json:
            err.print(f"no --first-kept: using Pi's cut point, first kept entry {cut.firstKeptEntryId} (position "
                      f"{cut.firstKeptPosition} on the branch, keepRecentTokens {settings.keepRecentTokens})",
                      highlight=False)
    pool = pool_max if pool_max is not None else settings.observationsPoolMaxTokens
    if gap_safe:  # the live hook's compaction (SPEC §13): F moved back, or declined to Pi's summary
        done = gap_free_compaction(workspace({"observationsPoolMaxTokens": pool}), session, first_kept, leaf,
                                   replayed=replayed)
        why = done.why(settings.retained_max_tokens)
        if as_json:
            print_json({**(done.result.as_json() if done.result is not None else {"summary": None}),
                        **({"cut_point": cut.as_json()} if cut else {}), "gap_free": done.as_json(),
                        **({"declined_why": why} if why else {})})
            return
        if done.result is None:
            err.print(f"declined: {why}; Pi's native summarizer would run instead")
            return
        if done.decision.moved:
            err.print(f"gap-free first kept entry: {done.first_kept} (Pi's {done.proposed_first_kept}; "
                      f"{done.decision.retained_tokens} tokens retained, {done.decision.freed_tokens} freed)")
        result = done.result
    else:
        result = run_compact(ws, session, first_kept, leaf, pool, replayed=replayed)
        if as_json:
            print_json({**result.as_json(), **({"cut_point": cut.as_json()} if cut else {})})
            return
    if replayed:
        err.print("replayed: the replay's simulated compactions count (what the extension would have folded "
                  "had it lived the session, not what the session file holds)")
    if result.summary is None:
        err.print("the projection is empty: Pi's native summarizer would run instead"
                  if result.declined in (None, DeclineReason.EMPTY_PROJECTION) else
                  f"no memory record fits compactionSummaryMaxTokens {result.summaryMaxTokens}: Pi's native "
                  "summarizer would run instead")
        return
    sys.stdout.write(result.summary + "\n")
    err.print(f"fullFold={str(result.fullFold).lower()}  observations={len(result.memory.observations)}  "
              f"reflections={len(result.memory.reflections)}" + (
                  f"  left out: {result.leftOutObservations} observation(s), {result.leftOutReflections} "
                  f"reflection(s) (compactionSummaryMaxTokens {result.summaryMaxTokens})"
                  if result.leftOutObservations or result.leftOutReflections else ""))
    if session_offline(ws, session):
        err.print(OFFLINE_MEMORY, highlight=False)


@app.command(epilog=examples('om recall 3f9a0c1b2d4e', 'om recall 3f9a0c',
                            'om recall 3f9a0c1b2d4e --session SESSION --json',
                            'om recall "why did the upload retry" --session SESSION',
                            'om recall src/upload.py --json'))
def recall(
    memory_id: str = typer.Argument(..., metavar="ID|QUERY", help="A 12-hex observation or reflection id, or a "
                                    "unique prefix of one: its exact evidence. Anything else is a query: the "
                                    "memory and transcript it matches, best first."),
    session: Optional[str] = typer.Option(None, "--session", help="Limit to one session (default: all sessions); "
                                          "a query ranks that session's branch first, then its project."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Branch ending at this entry (needs --session)."),
    limit: int = typer.Option(10, "--limit", min=1, max=200, help="A query's hits, at most."),
    embeddings: Optional[bool] = typer.Option(None, "--embeddings/--no-embeddings", help="Fuse semantic similarity "
                                              "into a query's ranking (default: the recallEmbeddings setting)."),
    as_json: bool = typer.Option(False, "--json", help="Print the recall result as JSON."),
    raw: bool = typer.Option(False, "--raw", help="Print the texts exactly as stored, secrets included (default: "
                             "secrets redacted as in compaction summaries, [REDACTED:<kind>])."),
) -> None:
    """The exact evidence behind a memory id: records, status, and the original source messages, with
    their secrets redacted (as the recall tool gives them to a model) unless --raw. Given words instead
    of an id: the memory and transcript they match (keyword ranking, fused with semantic similarity
    when recallEmbeddings is on), each with the id to recall next."""
    from om_core.recall.evidence import recall as run_recall
    from om_core.recall.evidence import redacted
    from om_core.recall.query import is_query

    if leaf is not None and session is None:
        raise InvalidArgument("--leaf needs --session")
    if is_query(memory_id):
        _recall_query(memory_id, session, leaf, limit, embeddings, as_json)
        return
    result = run_recall(workspace(), memory_id, session, leaf)
    if not raw:
        result = redacted(result)
    if as_json:
        print_json(result.as_json())
    else:
        _print_recall(result)
    if result.status == "invalid_id":
        raise typer.Exit(2)
    if result.status not in ("found", "orphaned"):  # orphaned: the records are shown, their source is gone
        raise typer.Exit(1)


def _recall_query(text: str, session: str | None, leaf: str | None, limit: int, embeddings: bool | None,
                  as_json: bool) -> None:
    from om_core.recall.query import recall_query

    result = recall_query(workspace(), text, session, leaf, limit=limit, embeddings=embeddings)
    if as_json:
        print_json(result.as_json())
    else:
        labels = {"branch": "this session", "project": "project", "everywhere": ""}
        for hit in result.hits:
            where = labels[hit.where] if hit.kind != "project_reflection" else f"project {hit.project_id}"
            if hit.where == "project" and hit.kind != "project_reflection":
                where = f"session {hit.session_id}"
            ref = hit.memory_id or f"entry {hit.entry_id}"
            out.print(f"[bold]{hit.rank}.[/] {escape(ref)} [dim]{hit.kind}{', ' + escape(where) if where else ''}"
                      f"{', exact identifier' if hit.exact_identifier else ''}[/]", highlight=False)
            _exact("   " + " ".join(hit.text.split()))
        if result.embeddings_wanted and result.mode == "keyword":
            err.print(f"keyword ranking only: {escape(result.embeddings)}", highlight=False)
        if result.unindexed:
            err.print(f"{result.unindexed} documents are not indexed yet (another process is writing)")
    if not result.hits:
        if not as_json:
            err.print(f"error: nothing matched {escape(text)!s}", highlight=False)
        raise typer.Exit(1)


def _print_recall(result) -> None:
    if result.status == "orphaned":
        out.print(f"[bold]{result.id}[/]: [yellow]its source is gone[/] (the session file was rewritten)")
        _print_orphaned(result.orphaned)
        return
    if result.status != "found":
        err.print("error: " + escape(result.message or result.status), highlight=False)
        return

    def flagged(x) -> str:
        flags = [f for f, on in (("collision", x.collision), ("partial", x.partial)) if on]
        return f"{x.kind}" + (f" ({', '.join(flags)})" if flags else "")

    where = result.session_ids + [f"project {p.project_id}" for p in result.projects]
    out.print(f"[bold]{result.id}[/]: {flagged(result)} in {escape(', '.join(where))}")

    for group in result.sessions:  # each session's branch on its own (SPEC §6)
        if len(result.sessions) > 1:
            out.print(f"\n[bold]session {escape(group.session_id)}[/] at {escape(group.tip)}: {flagged(group)}")
        for r in group.reflections:
            out.print("\n[bold]reflection[/] ", end="")
            _exact(f"[{r.id}] {r.content}")
            out.print(f"  supported by {', '.join(r.supporting_observation_ids)}")
        supporting = {i for r in group.reflections for i in r.supporting_observation_ids}
        for o in group.observations:
            label = ("observation" if o.matched else "supporting observation" if o.id in supporting
                     else "superseded observation")
            out.print(f"\n[bold]{label}[/] ({o.status}) ", end="")
            _exact(f"[{o.id}] {o.ts} [{o.relevance}] {o.content}")
            if o.supersedes:
                out.print(f"  supersedes {', '.join(o.supersedes)}")
            if o.superseded_by:
                out.print(f"  [yellow]superseded by[/] {', '.join(o.superseded_by)}")
            for src in o.sources:
                # the source entry's text exactly as Pi holds it (SPEC §6): not indented, not wrapped
                out.print(f"[dim]--- source {escape(src.entry_id)} {escape(src.role or '')} "
                          f"@ {escape(src.ts or '')}[/]")
                _exact(src.text)
            if o.missing_source_entry_ids:
                out.print(f"  [yellow]missing from branch:[/] {', '.join(o.missing_source_entry_ids)}")
            if o.non_source_entry_ids:
                out.print(f"  [yellow]not source entries:[/] {', '.join(o.non_source_entry_ids)}")
        if group.missing_supporting_observation_ids:
            out.print(f"[yellow]supporting ids never recorded:[/] {', '.join(group.missing_supporting_observation_ids)}")
    for project in result.projects:  # a project reflection, and the session memory it rests on
        out.print(f"\n[bold]project {escape(project.project_id)}[/]")
        for r in project.reflections:
            state = "current" if r.status == "current" else f"retired: {r.retired_reason}"
            out.print(f"\n[bold]project reflection[/] ({escape(state)}) ", end="")
            _exact(f"[{r.id}] {r.content}")
            out.print(f"  rests on {', '.join(r.supporting_ids)}")
        for group in project.sessions:
            for item in group.reflections:
                out.print(f"\n[bold]session reflection[/] in {escape(group.session_id)} ", end="")
                _exact(f"[{item.id}] {item.content}")
            for o in group.observations:
                out.print(f"\n[bold]session observation[/] ({o.status}) in {escape(group.session_id)} ", end="")
                _exact(f"[{o.id}] {o.ts} [{o.relevance}] {o.content}")
                for src in o.sources:
                    out.print(f"[dim]--- source {escape(src.entry_id)} {escape(src.role or '')} "
                              f"@ {escape(src.ts or '')}[/]")
                    _exact(src.text)
        if project.missing_supporting_ids:
            out.print(f"[yellow]recorded in none of its sessions now:[/] {', '.join(project.missing_supporting_ids)}")
    if result.orphaned:
        out.print("\n[bold]also in records whose source is gone[/] (the session file was rewritten)")
        _print_orphaned(result.orphaned)


def _exact(text: str) -> None:
    # recorded text goes out byte for byte: Rich would wrap it, expand tabs and strip control codes
    out.file.write(text + "\n")
    out.file.flush()


def _print_orphaned(orphans) -> None:
    for o in orphans:
        text = f"[{o.id}] {o.ts} [{o.relevance}] {o.content}" if o.kind == "observation" else f"[{o.id}] {o.content}"
        out.print(f"\n[bold]{o.kind}[/] (orphaned, record {escape(o.ledger_id)}) ", end="")
        _exact(text)
        out.print(f"  [yellow]source gone:[/] {escape(o.why)}", highlight=False)


@app.command(epilog=examples('om status', 'om status SESSION', 'om status SESSION --model openai/gpt-4o-mini',
                            'om status SESSION --leaf ID --json'))
def status(
    session: Optional[str] = typer.Argument(None, help="Session id, unique id prefix, or ingested file path "
                                            "(default: one line for every session)."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Status as of this entry (default: current leaf)."),
    model: Optional[str] = typer.Option(None, "--model", envvar="OM_MODEL", help="The model om run would use (default: "
                                        "the configured one, else the offline baseline): due is what that run does."),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
) -> None:
    """Memory status: observation and reflection counts, drift, the four clocks, pool pressure, errors.

    A clock is due when the next om run runs its stage on the memory as it stands: om run replays the
    session (it changed since its last complete replay) and the replay's rules run the stage at the
    branch's last turn end. Where a clock passed its threshold and its stage would still not run, the
    reason is given in words (nothing new since the last replay, backed off after an empty result, this
    input already answered).

    Without SESSION: every session on one line each (memory counts, what is visible, whether the next
    om run replays it)."""
    from om_core.usecases.status import status as branch_status

    if session is None:
        if leaf is not None:
            raise InvalidArgument("--leaf needs a SESSION")
        _all_sessions_status(model, as_json)
        return
    s = branch_status(workspace(), session, leaf, model)
    if as_json:
        print_json(s.model_dump(mode="json"))
        return
    o, r, p = s.observations, s.reflections, s.pools
    out.print(f"[bold]{s.session_id}[/] at {s.tip}")
    out.print(f"observations: {o['recorded']} recorded, {o['active']} active, {o['dropped']} dropped, "
              f"{o['visible']} visible")
    out.print(f"reflections: {r['recorded']} recorded, {r['visible']} visible")
    out.print(f"drift: {len(s.drift.observations_only_in_full)} observation(s) and {len(s.drift.reflections_only_in_full)} "
              f"reflection(s) only in full memory; {len(s.drift.visible_no_longer_active)} visible but no longer active")
    if s.visible_compaction is None and (o["active"] or r["recorded"]):
        out.print("visible: nothing (the session file holds no om.folded compaction on this branch; "
                  "full memory: om view --full)")
    x = s.replayed
    if x.simulated_compactions and x.compaction is not None:
        out.print(f"replayed (the replay's simulated compactions, not what the agent saw): {x.observations} "
                  f"observations, {x.reflections} reflections from {x.compaction.origin} compaction "
                  f"{x.compaction.compaction_id}; {x.drift.total} item(s) of drift: om view --replayed")
    print_rows(["clock", "tokens", "basis", "threshold", "due", "since"],
               [[c.name, str(c.tokens), c.basis + (f" (fallback: {c.fallback})" if c.fallback else ""),
                 "" if c.threshold is None else str(c.threshold),
                 "" if c.due is None else ("yes" if c.due else "no"), c.watermark_entry_id or "start"]
                for c in s.clocks.values()])
    n = s.next_run
    if n.model_from == "its last replay":  # a plain `om run` (no model configured) uses the offline baseline
        out.print(escape(f"next om run --model {n.model} (the model of its last replay): {n.why}"), highlight=False)
        out.print("  (plain om run, with no model configured, uses the offline baseline: another model, so it "
                  "replays the session)", highlight=False)
    else:
        out.print(escape(f"next om run ({n.model}): {n.why}"), highlight=False)
    for c in s.clocks.values():
        if c.reached and not c.due and c.why:  # past its threshold, yet its stage would not run
            out.print(escape(f"  {c.name}: past its threshold; " + (f"when replayed, not run: {c.why}" if not n.replays
                                                                     else f"not run: {c.why}")), highlight=False)
    if n.replays and n.uncovered_tokens:
        out.print(f"  its drain observes the {n.uncovered_tokens:,} uncovered source tokens at the branch end "
                  "(om run --no-drain leaves them to the observer's clock)", highlight=False)
    out.print(f"pools: active {p['active_tokens']} / target {p['target_tokens']} / max {p['max_tokens']} tokens "
              f"({p['active_pressure']:.0%}); visible {p['visible_tokens']} ({p['visible_pressure']:.0%})")
    for e in s.last_errors:
        out.print(f"[yellow]{e.get('source')}[/]: " + escape(f"{e.get('reason')} {e.get('detail') or ''}"),
                  highlight=False)


def _all_sessions_status(model: Optional[str], as_json: bool) -> None:
    """`om status` without a session: each session's status on one line (the same status, one path)."""
    from om_core.memory.views import offline_memory
    from om_core.usecases.status import status as branch_status
    from om_core.pi.session import file_label
    from om_core.store.catalog import sessions as list_sessions

    ws = workspace()
    rows = []
    for info in list_sessions(ws):
        s = branch_status(ws, info.session_id, None, model)
        with ws.read() as con:
            offline = offline_memory(con, info.session_id)
        rows.append({"session_id": s.session_id, "file": info.file_path, "observations": s.observations["active"],
                     "reflections": s.reflections["recorded"], "visible": s.observations["visible"]
                     + s.reflections["visible"], "replayed": s.replayed.observations + s.replayed.reflections,
                     "offline": offline, "next_run_replays": s.next_run.replays, "next_run": s.next_run.why})
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print(escape(f"no sessions in {ws.path} (om run PATH ingests and processes them)"), highlight=False)
        return
    print_rows(["session", "file", "observations", "reflections", "visible", "replayed", "memory by", "next om run"],
               [[r["session_id"], file_label(Path(r["file"]).name, r["session_id"]), str(r["observations"]),
                 str(r["reflections"]), str(r["visible"]), str(r["replayed"]),
                 "offline baseline" if r["offline"] else ("a model" if r["observations"] else ""),
                 "replays" if r["next_run_replays"] else "nothing to do"] for r in rows],
               short={"session"}, fold={"file"}, drop=["replayed", "file"])
    out.print(escape(f"database {ws.path}; om status SESSION for one session's clocks and pools"), highlight=False)
