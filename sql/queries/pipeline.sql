-- name: run_summary
-- What one run did, per session (named by its file too): records appended, compactions, model calls,
-- tokens, cost, errors.
WITH s AS (SELECT unnest($session_ids::VARCHAR[]) AS session_id)
SELECT s.session_id,
       (SELECT f.file_path FROM om_internal.sessions f WHERE f.session_id = s.session_id) AS file,
       (SELECT count(*) FROM om_internal.observations o JOIN om_internal.ledger r USING (session_id, ledger_id)
        WHERE r.session_id = s.session_id AND r.run_id = $run_id) AS observations,
       (SELECT count(*) FROM om_internal.reflections x JOIN om_internal.ledger r USING (session_id, ledger_id)
        WHERE r.session_id = s.session_id AND r.run_id = $run_id) AS reflections,
       (SELECT count(*) FROM om_internal.drops d JOIN om_internal.ledger r USING (session_id, ledger_id)
        WHERE r.session_id = s.session_id AND r.run_id = $run_id)
       + (SELECT count(*) FROM om_internal.reflection_drops d JOIN om_internal.ledger r USING (session_id, ledger_id)
          WHERE r.session_id = s.session_id AND r.run_id = $run_id) AS drops,
       (SELECT count(*) FROM om_internal.compactions c WHERE c.session_id = s.session_id AND c.run_id = $run_id) AS compactions,
       (SELECT count(*) FROM om_internal.llm_calls m WHERE m.session_id = s.session_id AND m.run_id = $run_id) AS model_calls,
       (SELECT coalesce(sum(input_tokens), 0) + coalesce(sum(output_tokens), 0) FROM om_internal.llm_calls m
        WHERE m.session_id = s.session_id AND m.run_id = $run_id) AS tokens,
       (SELECT sum(cost) FROM om_internal.llm_calls m WHERE m.session_id = s.session_id AND m.run_id = $run_id) AS cost,
       (SELECT count(*) FROM om_internal.llm_calls m WHERE m.session_id = s.session_id AND m.run_id = $run_id
          AND m.status = 'ok' AND m.cost IS NULL) AS unpriced_calls,
       (SELECT count(*) FROM om_internal.stages t WHERE t.session_id = s.session_id AND t.run_id = $run_id
          AND t.outcome = 'failed') AS errors
FROM s ORDER BY s.session_id;

-- name: sessions_largest_first
-- The longest sessions start first, so one of them does not finish alone at the end of a run.
SELECT session_id FROM om_internal.sessions WHERE list_contains($session_ids::VARCHAR[], session_id)
ORDER BY tokens_pi DESC NULLS LAST, session_id;

-- name: board_sessions
-- What `om run`'s live board shows of each session beside its id: its file, and its entries (the weight
-- of its share in the estimate of what is left).
SELECT session_id, file_path, entry_count FROM om_internal.sessions
WHERE list_contains($session_ids::VARCHAR[], session_id);
