-- name: observer_backlog
-- Source entries on the branch after a position (and up to $until), oldest first (the observer's
-- uncovered span; the drain ends its chunks before Pi's cut point).
SELECT b.position, e.entry_id, e.entry_type, e.role, e.ts, e.tokens_pi, e.tokens, e.raw
FROM branch($session_id, $tip) b
JOIN om_internal.entries e ON e.session_id = $session_id AND e.entry_id = b.entry_id
WHERE e.is_source AND b.position > $after AND b.position <= $until
ORDER BY b.position;

-- name: observation_watermark_entry
SELECT arg_max(covers_up_to_id, wm_pos) AS watermark_entry_id FROM branch_records($session_id, $tip)
WHERE kind = 'om.observations.recorded' AND wm_pos IS NOT NULL;

-- name: observation_watermark_position
-- The observer's progress: the greatest observation watermark on the branch (NULL: none yet).
SELECT max(wm_pos) AS watermark_position FROM branch_records($session_id, $tip) WHERE kind = 'om.observations.recorded';

-- name: entry_timestamp
SELECT ts FROM om_internal.entries WHERE session_id = $session_id AND entry_id = $entry_id;

-- name: positions_of
SELECT entry_id, position FROM branch($session_id, $tip) WHERE list_contains($ids::VARCHAR[], entry_id);

-- name: insert_stage_run
INSERT INTO om_internal.stages (stage_run_id, run_id, session_id, stage, stage_key, tip_entry_id, chunk_first_id,
                        chunk_last_id, model, outcome, records, items, rejected, error_kind, error, receipts,
                        started_at)
VALUES ($stage_run_id, $run_id, $session_id, $stage, $stage_key, $tip_entry_id, $chunk_first_id,
        $chunk_last_id, $model, $outcome, $records, $items, $rejected, $error_kind, $error, $receipts,
        $started_at);

-- name: insert_model_calls
-- Model calls, one row per element of the column lists (all of one length): one statement for any
-- number of calls, with no Arrow table registered per call (that cost more than the insert).
INSERT INTO om_internal.llm_calls (call_id, run_id, stage_run_id, session_id, stage, model, turn, input_tokens,
                         output_tokens, cached_tokens, cost, latency_ms, status, error_kind, error, attempt,
                         started_at, fallback)
SELECT unnest($call_id::VARCHAR[]), unnest($run_id::VARCHAR[]), unnest($stage_run_id::VARCHAR[]),
       unnest($session_id::VARCHAR[]), unnest($stage::VARCHAR[]), unnest($model::VARCHAR[]),
       unnest($turn::INTEGER[]), unnest($input_tokens::INTEGER[]), unnest($output_tokens::INTEGER[]),
       unnest($cached_tokens::INTEGER[]), unnest($cost::DOUBLE[]), unnest($latency_ms::DOUBLE[]),
       unnest($status::VARCHAR[]), unnest($error_kind::VARCHAR[]), unnest($error::VARCHAR[]),
       unnest($attempt::INTEGER[]), unnest($started_at::TIMESTAMPTZ[]), unnest($fallback::BOOLEAN[]);

-- name: empty_runs
-- Where the observer (and the reflector) gave a deliberate empty result on this branch, for their
-- backoff (SPEC §9; the reflector's is the reflectorBackoff setting's).
SELECT DISTINCT s.stage, b.position
FROM om_internal.stages s JOIN branch($session_id, $tip) b ON b.entry_id = s.tip_entry_id
WHERE s.session_id = $session_id AND s.outcome = 'empty' AND s.stage IN ('observer', 'reflector')
ORDER BY 1, 2;

-- name: stage_state
-- What earlier runs did with this exact stage input: appended it, found it empty, or computed it.
SELECT EXISTS (SELECT 1 FROM om_internal.ledger WHERE session_id = $session_id AND stage_key = $stage_key)
           AS appended,
       EXISTS (SELECT 1 FROM om_internal.stages WHERE session_id = $session_id AND stage_key = $stage_key
                                          AND outcome = 'empty')
           AS was_empty;

-- name: stage_result
-- A stage result computed but not yet appended (a command's exactly-once: om_core.replay.stage_runner).
SELECT result FROM om_internal.stage_results WHERE session_id = $session_id AND stage_key = $stage_key;

-- name: delete_committed_stage_results
-- A session's kept stage results whose records are in the ledger now: nothing will ask for them again.
DELETE FROM om_internal.stage_results
WHERE session_id = $session_id
  AND stage_key IN (SELECT stage_key FROM om_internal.ledger WHERE session_id = $session_id AND stage_key IS NOT NULL);

-- name: committed_stage_keys
-- Of these stage keys of a session, those whose records are in the ledger now, or whose deliberate
-- empty result its stages row keeps (stage_state's was_empty): the results a flow kept for them in its
-- result storage are no longer needed (flows.storage.PrefectStageResults.forget).
SELECT DISTINCT stage_key FROM om_internal.ledger
WHERE session_id = $session_id AND list_contains($stage_keys, stage_key)
UNION
SELECT DISTINCT stage_key FROM om_internal.stages
WHERE session_id = $session_id AND outcome = 'empty' AND list_contains($stage_keys, stage_key);

-- name: put_stage_result
INSERT OR REPLACE INTO om_internal.stage_results (session_id, stage_key, stage, result)
VALUES ($session_id, $stage_key, $stage, $result);

-- name: delete_stage_result
DELETE FROM om_internal.stage_results WHERE session_id = $session_id AND stage_key = $stage_key;

-- name: ledger_has_stage_key
SELECT count(*) > 0 FROM om_internal.ledger WHERE session_id = $session_id AND stage_key = $stage_key;

-- name: compaction_anchor_positions
-- Where compactions sit on the branch; simulated ones are not entries, so the replay needs them to
-- bound later cut points the way a written compaction entry would.
-- A simulated one's first kept entry: Pi 1.6 cuts the projection that compaction leaves (its kept range).
SELECT anchor_pos AS position, bool_or(origin = 'simulated') AS simulated,
       arg_max(first_kept_entry_id, compaction_order) FILTER (WHERE origin = 'simulated') AS simulated_first_kept
FROM branch_compactions($session_id, $tip) GROUP BY anchor_pos ORDER BY 1;

-- name: ledger_anchor_positions
SELECT DISTINCT anchor_pos AS position FROM branch_records($session_id, $tip) ORDER BY 1;

-- name: record_anchor_positions
-- Where the records of one kind sit on the branch: a stage on its own clock (the reflection
-- dropper, SPEC §13) counts source tokens from its latest record.
SELECT DISTINCT anchor_pos AS position FROM branch_records($session_id, $tip) WHERE kind = $kind ORDER BY 1;

-- name: replay_branch
-- extension_folded: a compaction entry that carries the extension's own valid om.folded details.
SELECT b.position, b.entry_id, b.entry_type, b.role, coalesce(b.tokens_pi, 0) AS tokens_pi,
       coalesce(b.tokens, 0) AS tokens, b.is_source,
       b.first_kept_entry_id, f.compaction_id IS NOT NULL AS extension_folded
FROM branch_detail($session_id, $tip) b
LEFT JOIN om_internal.compactions f
       ON f.session_id = $session_id AND f.compaction_id = b.entry_id AND f.origin = 'imported' AND f.folded
ORDER BY b.position;

-- name: session_leaves
SELECT t.entry_id FROM om_internal.entry_tree t JOIN om_internal.entries e ON e.session_id = t.session_id AND e.entry_id = t.entry_id
WHERE t.session_id = $session_id AND t.is_leaf ORDER BY e.line_no;

-- name: judged_observation_watermarks
-- Watermark positions of the observation records a compaction at p_compaction_pos is judged by.
SELECT DISTINCT wm_pos
FROM judged_observation_records($session_id, $leaf, $compaction_pos, $seq, $simulated)
ORDER BY 1;

-- name: gap_window
-- Branch entries between two positions (inclusive), with what gap-safe compaction needs.
SELECT b.position, e.entry_id, e.entry_type, e.role, e.is_source, coalesce(e.tokens_pi, 0) AS tokens, e.raw
FROM branch($session_id, $leaf) b JOIN om_internal.entries e ON e.session_id = $session_id AND e.entry_id = b.entry_id
WHERE b.position BETWEEN $from_pos AND $to_pos
ORDER BY b.position;

-- name: source_tokens_between
SELECT coalesce(sum(e.tokens_pi), 0)
FROM branch($session_id, $leaf) b JOIN om_internal.entries e ON e.session_id = $session_id AND e.entry_id = b.entry_id
WHERE b.position BETWEEN $from_pos AND $to_pos AND e.is_source;

-- name: leaf_of
-- A leaf below an entry (the smallest id) and the entry's position.
SELECT min(l.entry_id) AS leaf_id, min(n.depth) AS position
FROM om_internal.entry_tree n
JOIN om_internal.entry_tree l ON l.session_id = n.session_id AND l.is_leaf AND n.pre <= l.pre AND l.pre <= n.last
WHERE n.session_id = $session_id AND n.entry_id = $entry_id;

-- name: compaction_gaps_for
SELECT * FROM compaction_gaps
WHERE ($session_ids IS NULL OR list_contains($session_ids::VARCHAR[], session_id))
ORDER BY session_id, compaction_pos, origin, compaction_id, leaf_id;

-- name: classify_gap
SELECT g.c_pos, g.reach, g.gap_messages, g.gap_tokens,
       gap_class($empty, g.gap_messages, g.reach, $f_pos) AS class
FROM compaction_gap($session_id, $leaf, $compaction_pos, $seq, $simulated, $f_pos) g;

-- name: insert_model_call_texts
-- The texts of model calls, as insert_model_calls takes its rows (column lists of one length).
INSERT OR IGNORE INTO om_internal.llm_call_texts (call_id, run_id, request, response)
SELECT unnest($call_id::VARCHAR[]), unnest($run_id::VARCHAR[]), unnest($request::VARCHAR[]),
       unnest($response::VARCHAR[]);

-- name: observer_context
-- The last $n source entries on the branch at or before a position (the observer's context: the
-- entries just before its chunk, already observed), oldest first.
SELECT * FROM (
    SELECT b.position, e.entry_id, e.entry_type, e.role, e.ts, e.tokens_pi, e.tokens, e.raw
    FROM branch($session_id, $tip) b
    JOIN om_internal.entries e ON e.session_id = $session_id AND e.entry_id = b.entry_id
    WHERE e.is_source AND b.position <= $at
    ORDER BY b.position DESC
    LIMIT $n
) ORDER BY position;

-- name: entry_roles
-- The role of each of the given entries on the branch (the dropper's guard: which observations
-- cite the user's own words).
SELECT b.entry_id, e.role
FROM branch($session_id, $tip) b
JOIN om_internal.entries e ON e.session_id = $session_id AND e.entry_id = b.entry_id
WHERE list_contains($ids::VARCHAR[], b.entry_id);

-- name: session_model
-- The model the session talks to (SPEC §13): the one its latest assistant message names, with the
-- latest thinking level the file set (NULL when it set none).
SELECT json_extract_string(raw, '$.message.provider') AS provider,
       json_extract_string(raw, '$.message.model') AS id,
       (SELECT json_extract_string(t.raw, '$.thinkingLevel') FROM om_internal.entries t
        WHERE t.session_id = $session_id AND t.entry_type = 'thinking_level_change'
        ORDER BY t.line_no DESC LIMIT 1) AS thinking
FROM om_internal.entries
WHERE session_id = $session_id AND entry_type = 'message' AND role = 'assistant'
  AND json_extract_string(raw, '$.message.model') IS NOT NULL
ORDER BY line_no DESC
LIMIT 1;
