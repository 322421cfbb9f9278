-- A session's replay runs on a task-local in-memory copy of the session's rows (om_core.replay_payload):
-- the flow reads them here, the task loads them into the same schema, and the rows the replay
-- appended come back to be committed by the flow, which alone writes the user's database.

-- Record and compaction order (append_seq) is renumbered 1..n per session: only the order within a
-- session matters, and the task's own sequence then continues after n.

-- name: payload_sessions
SELECT * FROM sessions WHERE session_id = $session_id;

-- name: payload_entries
SELECT * FROM entries WHERE session_id = $session_id;

-- name: payload_entry_tree
SELECT * FROM entry_tree WHERE session_id = $session_id;

-- name: payload_ledger_records
WITH seqs AS (
    SELECT append_seq FROM ledger_records WHERE session_id = $session_id
    UNION ALL SELECT append_seq FROM compaction_folds WHERE session_id = $session_id
), renumbered AS (SELECT append_seq, row_number() OVER (ORDER BY append_seq) AS local_seq FROM seqs)
SELECT r.* REPLACE (n.local_seq AS append_seq)
FROM ledger_records r JOIN renumbered n USING (append_seq)
WHERE r.session_id = $session_id;

-- name: payload_ledger_observations
SELECT * FROM ledger_observations WHERE session_id = $session_id;

-- name: payload_ledger_reflections
SELECT * FROM ledger_reflections WHERE session_id = $session_id;

-- name: payload_ledger_drops
SELECT * FROM ledger_drops WHERE session_id = $session_id;

-- name: payload_compaction_folds
WITH seqs AS (
    SELECT append_seq FROM ledger_records WHERE session_id = $session_id
    UNION ALL SELECT append_seq FROM compaction_folds WHERE session_id = $session_id
), renumbered AS (SELECT append_seq, row_number() OVER (ORDER BY append_seq) AS local_seq FROM seqs)
SELECT f.* REPLACE (n.local_seq AS append_seq)
FROM compaction_folds f JOIN renumbered n USING (append_seq)
WHERE f.session_id = $session_id;

-- name: payload_compaction_fold_items
SELECT * FROM compaction_fold_items WHERE session_id = $session_id;

-- name: payload_stage_runs
-- Deliberate empty results decide the observer's backoff and are never asked again (exactly-once).
SELECT * FROM stage_runs WHERE session_id = $session_id AND outcome = 'empty';

-- name: load_sessions
INSERT INTO sessions BY NAME SELECT * FROM payload_batch;

-- name: load_entries
INSERT INTO entries BY NAME SELECT * FROM payload_batch;

-- name: load_entry_tree
INSERT INTO entry_tree BY NAME SELECT * FROM payload_batch;

-- name: load_ledger_records
INSERT INTO ledger_records BY NAME SELECT * FROM payload_batch;

-- name: load_ledger_observations
INSERT INTO ledger_observations BY NAME SELECT * FROM payload_batch;

-- name: load_ledger_reflections
INSERT INTO ledger_reflections BY NAME SELECT * FROM payload_batch;

-- name: load_ledger_drops
INSERT INTO ledger_drops BY NAME SELECT * FROM payload_batch;

-- name: load_compaction_folds
INSERT INTO compaction_folds BY NAME SELECT * FROM payload_batch;

-- name: load_compaction_fold_items
INSERT INTO compaction_fold_items BY NAME SELECT * FROM payload_batch;

-- name: load_stage_runs
INSERT INTO stage_runs BY NAME SELECT * FROM payload_batch;

-- name: advance_append_seq
-- The task's sequence continues after the session's renumbered records and compactions.
SELECT max(nextval('ledger_append_seq')) FROM range($n);

-- name: replayed_ledger_records
SELECT * FROM ledger_records WHERE run_id = $run_id AND origin = 'pipeline';

-- name: replayed_ledger_observations
SELECT o.* FROM ledger_observations o JOIN ledger_records r USING (session_id, ledger_id)
WHERE r.run_id = $run_id AND r.origin = 'pipeline';

-- name: replayed_ledger_reflections
SELECT x.* FROM ledger_reflections x JOIN ledger_records r USING (session_id, ledger_id)
WHERE r.run_id = $run_id AND r.origin = 'pipeline';

-- name: replayed_ledger_drops
SELECT d.* FROM ledger_drops d JOIN ledger_records r USING (session_id, ledger_id)
WHERE r.run_id = $run_id AND r.origin = 'pipeline';

-- name: replayed_compaction_folds
SELECT * FROM compaction_folds WHERE run_id = $run_id AND origin = 'simulated';

-- name: replayed_compaction_fold_items
SELECT i.* FROM compaction_fold_items i JOIN compaction_folds f USING (session_id, compaction_id)
WHERE f.run_id = $run_id AND f.origin = 'simulated';

-- name: replayed_stage_runs
SELECT * FROM stage_runs WHERE run_id = $run_id;

-- name: replayed_model_calls
SELECT * FROM model_calls WHERE run_id = $run_id;

-- name: replayed_model_call_texts
SELECT * FROM model_call_texts WHERE run_id = $run_id;

-- name: take_append_seqs
-- Fresh positions in the database's record order for a replay's new records and compactions.
SELECT nextval('ledger_append_seq') AS seq FROM range($n);

-- name: committed_ledger_ids
-- Records and compactions of a session that are already in the database (a re-committed replay
-- result changes nothing).
SELECT ledger_id AS id FROM ledger_records WHERE session_id = $session_id
UNION ALL SELECT compaction_id FROM compaction_folds WHERE session_id = $session_id;

-- name: commit_ledger_records
INSERT INTO ledger_records BY NAME SELECT * FROM replay_batch;

-- name: commit_ledger_observations
INSERT INTO ledger_observations BY NAME SELECT * FROM replay_batch;

-- name: commit_ledger_reflections
INSERT INTO ledger_reflections BY NAME SELECT * FROM replay_batch;

-- name: commit_ledger_drops
INSERT INTO ledger_drops BY NAME SELECT * FROM replay_batch;

-- name: commit_compaction_folds
INSERT INTO compaction_folds BY NAME SELECT * FROM replay_batch;

-- name: commit_compaction_fold_items
INSERT INTO compaction_fold_items BY NAME SELECT * FROM replay_batch;

-- name: commit_stage_runs
INSERT OR IGNORE INTO stage_runs BY NAME SELECT * FROM replay_batch;

-- name: commit_model_calls
INSERT OR IGNORE INTO model_calls BY NAME SELECT * FROM replay_batch;

-- name: commit_model_call_texts
INSERT OR IGNORE INTO model_call_texts BY NAME SELECT * FROM replay_batch;
