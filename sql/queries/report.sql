-- Queries of the HTML report (om report).

-- name: report_branch
SELECT position, ts, is_source, coalesce(tokens_pi, 0) FROM branch_detail($session_id, $tip) ORDER BY position;

-- name: report_memory_timeline
-- The ledger after each point on the branch where records were appended.
SELECT a.anchor_pos, a.anchor_entry_id,
       count(*) FILTER (WHERE l.item_kind = 'observation'),
       count(*) FILTER (WHERE l.item_kind = 'observation' AND NOT l.dropped),
       count(*) FILTER (WHERE l.item_kind = 'observation' AND l.dropped),
       count(*) FILTER (WHERE l.item_kind = 'reflection'),
       coalesce(sum(l.token_count) FILTER (WHERE l.item_kind = 'observation' AND NOT l.dropped), 0),
       coalesce(sum(l.token_count) FILTER (WHERE l.item_kind = 'reflection'), 0)
FROM (SELECT DISTINCT anchor_pos, anchor_entry_id FROM branch_records($session_id, $tip)) a
LEFT JOIN LATERAL (SELECT * FROM ledger_at($session_id, a.anchor_entry_id)) l ON true
GROUP BY a.anchor_pos, a.anchor_entry_id
ORDER BY a.anchor_pos;

-- name: report_calls_by_stage
SELECT coalesce(stage, '(none)') AS stage, count(*), count(*) FILTER (WHERE status <> 'ok'),
       coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0), coalesce(sum(cached_tokens), 0),
       sum(cost), count(*) FILTER (WHERE cost IS NULL AND coalesce(input_tokens, 0) + coalesce(output_tokens, 0) > 0),
       string_agg(DISTINCT model, ', ' ORDER BY model)
FROM llm_calls WHERE session_id = $session_id
GROUP BY ALL ORDER BY stage;

-- name: report_folded_memory
-- Visible memory (the session file's own om.folded compactions) and the replayed view (the replay's
-- simulated ones included) at the tip: observation and reflection counts.
SELECT (SELECT count(*) FILTER (WHERE item_kind = 'observation') FROM visible_projection($session_id, $tip)),
       (SELECT count(*) FILTER (WHERE item_kind = 'reflection') FROM visible_projection($session_id, $tip)),
       (SELECT count(*) FILTER (WHERE item_kind = 'observation') FROM replayed_projection($session_id, $tip)),
       (SELECT count(*) FILTER (WHERE item_kind = 'reflection') FROM replayed_projection($session_id, $tip));
