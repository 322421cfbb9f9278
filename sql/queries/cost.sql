-- Model cost (issue 14): what a run still has to process, and what runs cost.

-- name: unobserved_source_tokens
-- Source tokens (Pi's estimate) on the session's current branch after its observation watermark.
SELECT coalesce(sum(tokens_pi), 0) FROM branch_detail($session_id, $tip)
WHERE is_source AND position > coalesce($after, -1);

-- name: session_of_file
SELECT session_id, ingested_bytes FROM om_internal.session_files WHERE file_path = $path AND status = 'ingested';

-- name: run_cost
SELECT count(*) FILTER (WHERE status = 'ok') AS model_calls, sum(input_tokens) AS input_tokens,
       sum(cached_tokens) AS cached_tokens, sum(output_tokens) AS output_tokens, sum(cost) AS cost_usd,
       count(*) FILTER (WHERE status = 'ok' AND cost IS NULL) AS unpriced_calls
FROM om_internal.llm_calls WHERE run_id = $run_id;
