-- Queries of the HTML report (om report). Python reads their rows by column name
-- (om_core/report/data.py): keep the aliases in step with its row models.

-- name: report_branch
-- The current branch to the tip, one row per entry.
SELECT position, ts, is_source, coalesce(tokens_pi, 0) AS tokens_pi
FROM branch_detail($session_id, $tip) ORDER BY position;

-- name: report_memory_timeline
-- The ledger after each point on the branch where records were appended.
SELECT a.anchor_pos AS position, a.anchor_entry_id AS entry_id,
       count(*) FILTER (WHERE l.item_kind = 'observation') AS recorded,
       count(*) FILTER (WHERE l.item_kind = 'observation' AND NOT l.dropped) AS active,
       count(*) FILTER (WHERE l.item_kind = 'observation' AND l.dropped) AS dropped,
       count(*) FILTER (WHERE l.item_kind = 'reflection') AS reflections,
       coalesce(sum(l.token_count) FILTER (WHERE l.item_kind = 'observation' AND NOT l.dropped), 0) AS pool_tokens,
       coalesce(sum(l.token_count) FILTER (WHERE l.item_kind = 'reflection'), 0) AS reflection_tokens
FROM (SELECT DISTINCT anchor_pos, anchor_entry_id FROM branch_records($session_id, $tip)) a
LEFT JOIN LATERAL (SELECT * FROM ledger_at($session_id, a.anchor_entry_id)) l ON true
GROUP BY a.anchor_pos, a.anchor_entry_id
ORDER BY a.anchor_pos;

-- name: report_calls_by_stage
-- Model calls of a session by stage; unpriced: calls with tokens but no cost (litellm did not know the model).
SELECT coalesce(stage, '(none)') AS stage, count(*) AS calls, count(*) FILTER (WHERE status <> 'ok') AS errors,
       coalesce(sum(input_tokens), 0) AS input_tokens, coalesce(sum(output_tokens), 0) AS output_tokens,
       coalesce(sum(cached_tokens), 0) AS cached_tokens, sum(cost) AS cost,
       count(*) FILTER (WHERE cost IS NULL AND coalesce(input_tokens, 0) + coalesce(output_tokens, 0) > 0) AS unpriced,
       coalesce(string_agg(DISTINCT model, ', ' ORDER BY model), '') AS models
FROM llm_calls WHERE session_id = $session_id
GROUP BY ALL ORDER BY stage;

-- name: report_folded_memory
-- Visible memory (the session file's own om.folded compactions) and the replayed view (the replay's
-- simulated ones included) at the tip: observation and reflection counts.
SELECT (SELECT count(*) FILTER (WHERE item_kind = 'observation') FROM visible_projection($session_id, $tip))
           AS visible_observations,
       (SELECT count(*) FILTER (WHERE item_kind = 'reflection') FROM visible_projection($session_id, $tip))
           AS visible_reflections,
       (SELECT count(*) FILTER (WHERE item_kind = 'observation') FROM replayed_projection($session_id, $tip))
           AS replayed_observations,
       (SELECT count(*) FILTER (WHERE item_kind = 'reflection') FROM replayed_projection($session_id, $tip))
           AS replayed_reflections;

-- name: report_recorded_everywhere
-- Every observation and reflection recorded in a session, on every branch, repeats included: what
-- `om run`'s summary adds up as its runs append them. The report's other counts are the current
-- branch's (first occurrence of an id wins), so the page says how far the two differ.
SELECT (SELECT count(*) FROM om_internal.observations WHERE session_id = $session_id) AS observations,
       (SELECT count(*) FROM om_internal.reflections WHERE session_id = $session_id) AS reflections;
