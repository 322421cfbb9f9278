-- A session's replay runs on a task-local in-memory copy of the session's rows (om_core.replay.payload):
-- the flow reads them here, the task loads them into the same schema, and the rows the replay
-- appended come back to be committed by the flow, which alone writes the user's database.

-- Record and compaction order (append_seq) is renumbered 1..n per session: only the order within a
-- session matters, and the task's own sequence then continues after n.

-- Statements the same for several tables but for the table are templates in tables/ (rows of a
-- session, the renumbered ledger and compactions, rows of replayed records, loads and commits),
-- instantiated per table by om_core.replay.payload; here are the statements of a shape of their own.

-- name: payload_stages
-- Deliberate empty results decide the observer's backoff and are never asked again (exactly-once).
SELECT * FROM om_internal.stages WHERE session_id = $session_id AND outcome = 'empty';

-- name: advance_append_seq
-- The task's sequence continues after the session's renumbered records and compactions.
SELECT max(nextval('om_internal.ledger_append_seq')) FROM range($n);

-- name: replayed_ledger
SELECT * FROM om_internal.ledger WHERE run_id = $run_id AND origin = 'pipeline';

-- name: replayed_compactions
SELECT * FROM om_internal.compactions WHERE run_id = $run_id AND origin = 'simulated';

-- name: replayed_compaction_items
SELECT i.* FROM om_internal.compaction_items i JOIN om_internal.compactions f USING (session_id, compaction_id)
WHERE f.run_id = $run_id AND f.origin = 'simulated';

-- name: replayed_stages
SELECT * FROM om_internal.stages WHERE run_id = $run_id;

-- name: replayed_llm_calls
-- The model calls of the stages this run recorded, also those an earlier (interrupted) run made, whose
-- persisted result this run recorded: they keep that run's id.
SELECT * FROM om_internal.llm_calls
WHERE stage_run_id IN (SELECT stage_run_id FROM om_internal.stages WHERE run_id = $run_id);

-- name: replayed_llm_call_texts
SELECT * FROM om_internal.llm_call_texts WHERE call_id IN (
    SELECT call_id FROM om_internal.llm_calls
    WHERE stage_run_id IN (SELECT stage_run_id FROM om_internal.stages WHERE run_id = $run_id));

-- name: take_append_seqs
-- Fresh positions in the database's record order for a replay's new records and compactions.
SELECT nextval('om_internal.ledger_append_seq') AS seq FROM range($n);

-- name: committed_ledger_ids
-- Records and compactions of a session that are already in the database (a re-committed replay
-- result changes nothing).
SELECT ledger_id AS id FROM om_internal.ledger WHERE session_id = $session_id
UNION ALL SELECT compaction_id FROM om_internal.compactions WHERE session_id = $session_id;
