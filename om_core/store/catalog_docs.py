"""What each view and macro of the analyst schema holds: the text the documentation's schema page is
generated from (docs_gen), next to the catalog that lists the objects themselves. A view or macro the
database has and this table does not describe fails the generator, so the page never drifts."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ObjectDoc(BaseModel):
    """One view or macro: what it holds, and what a parenthesis says about some of its columns."""

    what: str
    columns: dict[str, str] = Field(default_factory=dict)


SCHEMA_DOCS: dict[str, ObjectDoc] = {
    'sessions': ObjectDoc(what='one row per ingested session file', columns={'run_id': 'the ingest that stored it'}),
    'entries': ObjectDoc(what='one row per entry of every session file', columns={'line_no': '1-based, header = 1', 'raw': 'the line exactly as written'}),
    'entry_texts': ObjectDoc(what="one row per source entry, its text exactly as `om recall` prints it (text blocks verbatim, thinking and tool calls marked, a tool result under its tool's name, a shell run as its command and output, images as a placeholder)"),
    'entry_tree': ObjectDoc(what='one row per entry; X is on the branch ending at T when X.pre <= T.pre <= X.last', columns={'depth': 'its position on any branch through it'}),
    'branch_entries': ObjectDoc(what="one row per entry on each leaf's path (large for sessions with many leaves: filter by session)", columns={'position': '0-based from the root'}),
    'current_branches': ObjectDoc(what="the same for each session's current leaf"),
    'quarantine': ObjectDoc(what='the lines an ingest could not read, kept as they were, and why', columns={'raw': 'bytes'}),
    'ingest_notes': ObjectDoc(what="repairs that kept an entry (dangling_parent, parent_cycle), and each rewrite of the file that lost entries or memory evidence (rewritten, with what), Pi's migration followed (migrated), a fork's memory copied or not (forked, not_forked); later ingests keep those"),
    'ledger': ObjectDoc(what="every memory record: the file's own (imported) and this project's (pipeline)", columns={'origin': 'imported or pipeline'}),
    'observations': ObjectDoc(what='the observations of every record', columns={'ts_repaired_from': "the time the model gave when it lay outside the cited entries' times and om took the first cited entry's instead; NULL: as given"}),
    'reflections': ObjectDoc(what='the reflections of every record'),
    'drops': ObjectDoc(what='the observation ids each drop record retires', columns={'reason': "the dropper's reason for its record; NULL when none was given"}),
    'reflection_drops': ObjectDoc(what='the reflection ids `om.reflections.dropped` records tombstone (SPEC §13)', columns={'kind': "the record's `replacedBy` and `kind` as JSON text; NULL when absent"}),
    'ledger_rejects': ObjectDoc(what='ledger entries that were ignored (invalid, V2, unknown) and why'),
    'orphaned_records': ObjectDoc(what="this project's records whose evidence a rewrite of their session file took away ([Rewritten session files](../analysts.md#rewritten-session-files))", columns={'reason': 'session_gone, anchor_gone: on no branch any more; sources_gone: on its branch, some observation sources gone'}),
    'compactions': ObjectDoc(what="every compaction: Pi's own entries (pi), the extension's om.folded ones (imported), and the ones om simulated; full_fold and the item lists exist only for folded ones", columns={'origin': 'pi, imported, simulated'}),
    'compaction_items': ObjectDoc(what='the observations and reflections of each folded compaction'),
    'compaction_gaps': ObjectDoc(what='every compaction on every branch it appears on, with C, the gap and its class (`om gaps --help` explains them)'),
    'llm_calls': ObjectDoc(what='every model call: its stage, tokens, cost, latency and outcome'),
    'llm_call_texts': ObjectDoc(what='join `llm_calls` on `call_id`; empty when `storePrompts` is off', columns={'request': 'JSON {model, messages, tools} as sent, after redaction', 'response': 'JSON {content, tool_calls}; NULL for a failed call'}),
    'session_costs': ObjectDoc(what='per session', columns={'source_tokens': "Pi's estimate"}),
    'run_costs': ObjectDoc(what='per run'),
    'stages': ObjectDoc(what='every worker stage', columns={'outcome': 'recorded, empty, failed'}),
    'runs': ObjectDoc(what='every ingest and pipeline run', columns={'status': 'running, ok, failed, interrupted, or abandoned: its process ended without finishing'}),
    'entry_id_map': ObjectDoc(what="each entry id Pi's migration of a file (or a `pi --fork` copy) replaced, and the id om's records and compactions were re-anchored to ([Rewritten session files](../analysts.md#rewritten-session-files))", columns={'how': 'migrated, forked'}),
    'session_replays': ObjectDoc(what="what each session's last complete replay started from (its rows, settings, model, drain); `om run` skips a session whose fingerprint is unchanged"),
    'projects': ObjectDoc(what='every project ([Projects, search and forget](../projects.md))', columns={'name': 'its last path part: two projects can share one', 'reflections': 'recorded and not retired', 'new_tokens': "the project stage's clock"}),
    'project_sessions': ObjectDoc(what="each session's project", columns={'how': 'setting, git_remote, git_root, path', 'resolved_at': 'when its cwd was read: its first ingest'}),
    'project_ledger': ObjectDoc(what="the project ledger's records", columns={'kind': 'om.project.reflections.recorded, om.project.reflections.retired', 'covers_up_to_seq': "the session ledger's `append_seq` its stage read through", 'origin': 'pipeline, user'}),
    'project_reflections': ObjectDoc(what='the reflections of every project record', columns={'supporting_ids': 'session memory ids'}),
    'project_retirements': ObjectDoc(what='the reflection ids each project retirement record retires', columns={'reason': "superseded by [id], the stage's reason, or the user's"}),
    'project_stages': ObjectDoc(what='every project stage (its model calls: `llm_calls` with `stage` project, joined on `stage_run_id`)', columns={'outcome': 'recorded, empty, failed'}),
    'project_growth': ObjectDoc(what="the reflections and critical observations the project's sessions recorded since its stage last read them"),
    'search_documents': ObjectDoc(what="the search index's documents", columns={'doc_kind': 'observation, reflection, entry, project_reflection', 'scope_id': 'its session, or project', 'doc_id': 'memory id or entry id', 'length': 'terms'}),
    'search_terms': ObjectDoc(what='their terms (`text_terms`)'),
    'search_vectors': ObjectDoc(what='their embeddings for recall by meaning (`recallEmbeddings`)', columns={'vec': 'unit length'}),
    'session_id': ObjectDoc(what="a session reference as `om` commands take it (the id, a unique prefix, or the ingested file's path) as the session id the other macros take; an error names a reference that matches none or several"),
    'session_leaf': ObjectDoc(what="the current leaf of a session reference (as `session_id` takes it): `ledger_at(session_id('5b0e7c1a'), session_leaf('5b0e7c1a'))`"),
    'branch': ObjectDoc(what='the branch ending at tip, root first'),
    'branch_detail': ObjectDoc(what='the same with the columns most questions need'),
    'branch_records': ObjectDoc(what="every valid ledger record on the branch in branch order, with its watermark's position (NULL: dangling)"),
    'branch_compactions': ObjectDoc(what='every compaction on the branch in the same order'),
    'branch_folds': ObjectDoc(what="the folded compactions on the branch (the extension's and simulated ones), newest first (fold_rank 1)"),
    'fold': ObjectDoc(what="the fold: mode 'anchor' (records anchored through each bound) or 'watermark' (records whose watermark is through it)", columns={'rec_order': "its record's place in branch order", 'dropped_at': 'the record order of the first drop naming it'}),
    'ledger_at': ObjectDoc(what='the plain fold through the tip, dropped observations included: what the workers read', columns={'rec_order': "its record's place in branch order", 'dropped_at': 'the record order of the first drop naming it'}),
    'ledger_coverage': ObjectDoc(what="the same with each observation's coverage tier"),
    'coverage_tiers': ObjectDoc(what='active observations with their coverage tier (none, partial, strong)'),
    'full_projection': ObjectDoc(what='full memory at boundary: the records covered through it'),
    'folded_projection': ObjectDoc(what="the lists of the latest folded compaction: the file's own (replayed false) or simulated ones included (true)"),
    'visible_projection': ObjectDoc(what='visible memory: folded_projection with replayed false'),
    'replayed_projection': ObjectDoc(what='the replayed view: folded_projection with replayed true'),
    'compaction_decision': ObjectDoc(what='one row: the normal or full-fold decision at F = first_kept; M from the compactions the file holds (replayed false) or the simulated ones too (true)'),
    'compaction_projection': ObjectDoc(what='the items of the compaction at F, in the same world'),
    'memory_drift': ObjectDoc(what='full memory against visible memory'),
    'folded_drift': ObjectDoc(what='full memory against visible memory (replayed false) or the replayed view (true)'),
    'progress_clocks': ObjectDoc(what='the source-token clocks (`om status` shows the usage clocks too)'),
    'recall_observations': ObjectDoc(what='every recorded occurrence of these observation ids on the branch', columns={'status': 'active, dropped, forgotten'}),
    'recall_reflections': ObjectDoc(what='every recorded occurrence of this reflection id'),
    'resolve_entries': ObjectDoc(what='how cited entry ids resolve on the branch'),
    'judged_observation_records': ObjectDoc(what='the observation records a compaction is judged by (those before it in branch order)'),
    'compaction_gap': ObjectDoc(what='C, how far those records reach, and the raw messages between C and F'),
    'position_on_branch': ObjectDoc(what="the entry's position on the branch, NULL when it is not on it"),
    'gap_class': ObjectDoc(what="a compaction's gap class"),
    'orphaned_records_in': ObjectDoc(what='the orphaned records of one session (NULL: of all)'),
    'anchor_gone_reason': ObjectDoc(what='session_gone or anchor_gone when a record anchored there lies on no branch, else NULL'),
    'appended_by_project': ObjectDoc(what='whether a record or compaction of this origin was appended by om (pipeline, simulated) rather than read from the file'),
    'forgotten_ids': ObjectDoc(what='the ids a user forgot in the session (`om forget`): in no fold, projection or compaction of it'),
    'project_fold': ObjectDoc(what='the project fold: first record of an id wins, retirements are tombstones, forgotten supporting ids left out'),
    'project_memory': ObjectDoc(what="a project's current reflections"),
    'search_memory': ObjectDoc(what='BM25 over the index in one project, one session, or all (NULLs)'),
    'search_ranked': ObjectDoc(what='the BM25 ranking alone, without the hits\' texts (recall by query fuses it)'),
    'search_scope': ObjectDoc(what='the indexed documents a search looks at (forgotten ids left out)'),
    'semantic_memory': ObjectDoc(what="cosine similarity of a query's embedding to the documents in scope, most similar first"),
    'branch_documents': ObjectDoc(what="the session's memory recorded on the branch and its source entries (recall by query ranks these first)"),
    'text_terms': ObjectDoc(what="a text's search terms: words, identifiers (`err_conn_4417`, `upload.py`, `v1.2.3`) and paths (`src/upload.py:42`), lower case"),
}
