-- A session's replay runs on a task-local in-memory copy of the session's rows (om_core.replay_payload):
-- the flow reads them here, the task loads them into the same schema, and the rows the replay
-- appended come back to be committed by the flow, which alone writes the user's database.

-- Record and compaction order (append_seq) is renumbered 1..n per session: only the order within a
-- session matters, and the task's own sequence then continues after n.

-- name: payload_sessions
SELECT * FROM om_internal.sessions WHERE session_id = $session_id;

-- name: payload_entries
SELECT * FROM om_internal.entries WHERE session_id = $session_id;

-- name: payload_entry_tree
SELECT * FROM om_internal.entry_tree WHERE session_id = $session_id;

-- name: payload_ledger
WITH seqs AS (
    SELECT append_seq FROM om_internal.ledger WHERE session_id = $session_id
    UNION ALL SELECT append_seq FROM om_internal.compactions WHERE session_id = $session_id
), renumbered AS (SELECT append_seq, row_number() OVER (ORDER BY append_seq) AS local_seq FROM seqs)
SELECT r.* REPLACE (n.local_seq AS append_seq)
FROM om_internal.ledger r JOIN renumbered n USING (append_seq)
WHERE r.session_id = $session_id;

-- name: payload_observations
SELECT * FROM om_internal.observations WHERE session_id = $session_id;

-- name: payload_reflections
SELECT * FROM om_internal.reflections WHERE session_id = $session_id;

-- name: payload_drops
SELECT * FROM om_internal.drops WHERE session_id = $session_id;

-- name: payload_reflection_drops
SELECT * FROM om_internal.reflection_drops WHERE session_id = $session_id;

-- name: payload_compactions
WITH seqs AS (
    SELECT append_seq FROM om_internal.ledger WHERE session_id = $session_id
    UNION ALL SELECT append_seq FROM om_internal.compactions WHERE session_id = $session_id
), renumbered AS (SELECT append_seq, row_number() OVER (ORDER BY append_seq) AS local_seq FROM seqs)
SELECT f.* REPLACE (n.local_seq AS append_seq)
FROM om_internal.compactions f JOIN renumbered n USING (append_seq)
WHERE f.session_id = $session_id;

-- name: payload_compaction_items
SELECT * FROM om_internal.compaction_items WHERE session_id = $session_id;

-- name: payload_stages
-- Deliberate empty results decide the observer's backoff and are never asked again (exactly-once).
SELECT * FROM om_internal.stages WHERE session_id = $session_id AND outcome = 'empty';

-- name: load_sessions
INSERT INTO om_internal.sessions BY NAME SELECT * FROM payload_batch;

-- name: load_entries
INSERT INTO om_internal.entries BY NAME SELECT * FROM payload_batch;

-- name: load_entry_tree
INSERT INTO om_internal.entry_tree BY NAME SELECT * FROM payload_batch;

-- name: load_ledger
INSERT INTO om_internal.ledger BY NAME SELECT * FROM payload_batch;

-- name: load_observations
INSERT INTO om_internal.observations BY NAME SELECT * FROM payload_batch;

-- name: load_reflections
INSERT INTO om_internal.reflections BY NAME SELECT * FROM payload_batch;

-- name: load_drops
INSERT INTO om_internal.drops BY NAME SELECT * FROM payload_batch;

-- name: load_reflection_drops
INSERT INTO om_internal.reflection_drops BY NAME SELECT * FROM payload_batch;

-- name: load_compactions
INSERT INTO om_internal.compactions BY NAME SELECT * FROM payload_batch;

-- name: load_compaction_items
INSERT INTO om_internal.compaction_items BY NAME SELECT * FROM payload_batch;

-- name: load_stages
INSERT INTO om_internal.stages BY NAME SELECT * FROM payload_batch;

-- name: advance_append_seq
-- The task's sequence continues after the session's renumbered records and compactions.
SELECT max(nextval('om_internal.ledger_append_seq')) FROM range($n);

-- name: replayed_ledger
SELECT * FROM om_internal.ledger WHERE run_id = $run_id AND origin = 'pipeline';

-- name: replayed_observations
SELECT o.* FROM om_internal.observations o JOIN om_internal.ledger r USING (session_id, ledger_id)
WHERE r.run_id = $run_id AND r.origin = 'pipeline';

-- name: replayed_reflections
SELECT x.* FROM om_internal.reflections x JOIN om_internal.ledger r USING (session_id, ledger_id)
WHERE r.run_id = $run_id AND r.origin = 'pipeline';

-- name: replayed_drops
SELECT d.* FROM om_internal.drops d JOIN om_internal.ledger r USING (session_id, ledger_id)
WHERE r.run_id = $run_id AND r.origin = 'pipeline';

-- name: replayed_reflection_drops
SELECT d.* FROM om_internal.reflection_drops d JOIN om_internal.ledger r USING (session_id, ledger_id)
WHERE r.run_id = $run_id AND r.origin = 'pipeline';

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

-- name: commit_ledger
INSERT INTO om_internal.ledger BY NAME SELECT * FROM replay_batch;

-- name: commit_observations
INSERT INTO om_internal.observations BY NAME SELECT * FROM replay_batch;

-- name: commit_reflections
INSERT INTO om_internal.reflections BY NAME SELECT * FROM replay_batch;

-- name: commit_drops
INSERT INTO om_internal.drops BY NAME SELECT * FROM replay_batch;

-- name: commit_reflection_drops
INSERT INTO om_internal.reflection_drops BY NAME SELECT * FROM replay_batch;

-- name: commit_compactions
INSERT INTO om_internal.compactions BY NAME SELECT * FROM replay_batch;

-- name: commit_compaction_items
INSERT INTO om_internal.compaction_items BY NAME SELECT * FROM replay_batch;

-- name: commit_stages
INSERT OR IGNORE INTO om_internal.stages BY NAME SELECT * FROM replay_batch;

-- name: commit_llm_calls
INSERT OR IGNORE INTO om_internal.llm_calls BY NAME SELECT * FROM replay_batch;

-- name: commit_llm_call_texts
INSERT OR IGNORE INTO om_internal.llm_call_texts BY NAME SELECT * FROM replay_batch;
