-- Queries of `om eval longmemeval` (om_core/eval).

-- name: eval_compaction
-- The final compaction taken before the question (stored by simulate_compaction).
SELECT f.first_kept_entry_id, f.summary, f.folded, f.full_fold, f.note,
       (SELECT count(*) FROM om_internal.compaction_items i WHERE i.session_id = f.session_id
          AND i.compaction_id = f.compaction_id AND i.item_kind = 'observation') AS observations,
       (SELECT count(*) FROM om_internal.compaction_items i WHERE i.session_id = f.session_id
          AND i.compaction_id = f.compaction_id AND i.item_kind = 'reflection') AS reflections
FROM om_internal.compactions f
WHERE f.session_id = $session_id AND f.compaction_id = $compaction_id;

-- name: eval_call_totals
-- Model calls of the evaluated instances, by session and stage: the memory workers (observer,
-- reflector, dropper) of the om condition, and the evaluation's own calls, whose stage is
-- 'reader:CONDITION', 'judge:CONDITION' or 'native:native'.
SELECT session_id, stage,
       count(*) AS calls,
       count(*) FILTER (WHERE status = 'error') AS failed_calls,
       coalesce(sum(input_tokens), 0) AS input_tokens,
       coalesce(sum(output_tokens), 0) AS output_tokens,
       coalesce(sum(cached_tokens), 0) AS cached_tokens,
       sum(cost) AS cost,
       count(cost) AS priced_calls,
       coalesce(sum(latency_ms), 0) AS latency_ms
FROM llm_calls
WHERE list_contains($session_ids::VARCHAR[], session_id)
GROUP BY session_id, stage
ORDER BY session_id, stage;

-- name: eval_stage_runs
-- The stage runs that made a session's memory, by stage and outcome (resumed runs included): a
-- stage asked again with an input it already answered is no run, so it is not counted.
SELECT stage || ':' || outcome AS stage_outcome, count(*) AS runs
FROM om_internal.stages WHERE session_id = $session_id
GROUP BY ALL ORDER BY 1;
