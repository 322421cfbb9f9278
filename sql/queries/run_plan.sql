-- What a run decides before it starts anything (om_core.run_plan).

-- name: session_fingerprint_parts
-- The parts of a session a replay starts from, apart from this project's own appends: its entries,
-- its current leaf, and the ledger records and compactions the session file itself holds.
-- The leaf by the id om first knew it by: a file Pi only migrated (its ids replaced, entry_id_map) starts
-- the same replay, so it is not due again.
SELECT s.session_id,
       coalesce((SELECT any_value(x.old_id) FROM om_internal.entry_id_map x
                 WHERE x.session_id = s.session_id AND x.how = 'migrated' AND x.new_id = s.leaf_id), s.leaf_id)
           AS leaf_id,
       s.entry_count, s.source_count, s.leaf_count, coalesce(s.tokens_pi, 0) AS tokens_pi,
       (SELECT count(*) FROM om_internal.ledger r WHERE r.session_id = s.session_id AND r.origin = 'imported')
           AS imported_records,
       (SELECT count(*) FROM om_internal.compactions f WHERE f.session_id = s.session_id AND f.origin = 'imported')
           AS imported_folds,
       m.fingerprint AS replayed_fingerprint
FROM om_internal.sessions s LEFT JOIN om_internal.session_replays m USING (session_id)
WHERE list_contains($session_ids::VARCHAR[], s.session_id)
ORDER BY s.session_id;

-- name: put_session_replay
INSERT OR REPLACE INTO om_internal.session_replays (session_id, fingerprint, run_id) VALUES ($session_id, $fingerprint, $run_id);

-- name: run_failures
-- The stages of a run that failed, grouped by stage, session and error (shown under om run's table).
SELECT stage, session_id, coalesce(error, '') AS error, count(*) AS count
FROM om_internal.stages WHERE run_id = $run_id AND outcome = 'failed'
GROUP BY ALL ORDER BY session_id, stage, count DESC;

-- name: run_outcome
-- How much one run recorded: records and compactions committed, sessions touched.
SELECT (SELECT count(*) FROM om_internal.ledger WHERE run_id = $run_id) AS records,
       (SELECT count(*) FROM om_internal.observations o JOIN om_internal.ledger r USING (session_id, ledger_id)
        WHERE r.run_id = $run_id) AS observations,
       (SELECT count(*) FROM om_internal.compactions WHERE run_id = $run_id) AS compactions,
       (SELECT count(DISTINCT session_id) FROM om_internal.session_replays WHERE run_id = $run_id) AS sessions;

-- name: interrupt_run
UPDATE om_internal.runs SET status = 'interrupted', finished_at = current_timestamp, detail = $detail
WHERE run_id = $run_id AND status = 'running';

-- name: last_replay
-- A session's last complete replay: which run, when, and with which model (om status).
SELECT m.run_id, m.replayed_at,
       coalesce(r.detail ->> '$.model', (SELECT any_value(s.model) FROM om_internal.stages s
                                          WHERE s.run_id = m.run_id AND s.session_id = m.session_id
                                            AND s.model <> '')) AS model
FROM om_internal.session_replays m LEFT JOIN om_internal.runs r USING (run_id)
WHERE m.session_id = $session_id;
