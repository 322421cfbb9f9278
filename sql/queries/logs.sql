-- name: model_call_log
-- The model calls, newest first (om logs), with their request and response text when asked for.
SELECT c.started_at, c.session_id, c.stage, c.model, c.status, c.input_tokens, c.output_tokens,
       c.cached_tokens, c.cost, c.latency_ms, c.call_id, c.run_id, c.turn, c.attempt, c.error_kind, c.error,
       CASE WHEN $full THEN t.request END AS request,
       CASE WHEN $full THEN t.response END AS response
FROM llm_calls c LEFT JOIN llm_call_texts t USING (call_id)
WHERE ($session_id IS NULL OR c.session_id = $session_id)
  AND ($stage IS NULL OR c.stage = $stage)
ORDER BY c.started_at DESC, c.turn DESC, c.attempt DESC, c.call_id
LIMIT $limit;

-- name: model_call_stages
SELECT DISTINCT stage FROM llm_calls WHERE stage IS NOT NULL ORDER BY 1;
