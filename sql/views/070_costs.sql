-- What the model calls cost, per session and per run (issue 14). Cost is litellm's price of the
-- provider's reported usage (cached prompt tokens at the cache-read price); NULL when litellm has no
-- price for the model (unpriced_calls counts those calls). Per 1M source tokens uses Pi's estimate
-- of the session's source tokens (all branches).

CREATE OR REPLACE VIEW session_costs AS
    WITH calls AS (
        SELECT session_id,
               count(*) FILTER (WHERE status = 'ok') AS model_calls,
               count(*) FILTER (WHERE status = 'error') AS failed_calls,
               count(DISTINCT stage_run_id) FILTER (WHERE status = 'ok') AS stages_with_calls,
               coalesce(sum(input_tokens), 0) AS input_tokens,
               coalesce(sum(cached_tokens), 0) AS cached_tokens,
               coalesce(sum(output_tokens), 0) AS output_tokens,
               sum(cost) AS cost_usd,
               count(*) FILTER (WHERE status = 'ok' AND cost IS NULL) AS unpriced_calls
        FROM om_internal.llm_calls WHERE session_id IS NOT NULL GROUP BY session_id),
    source AS (
        SELECT session_id, sum(tokens_pi) AS source_tokens FROM om_internal.entries WHERE is_source GROUP BY session_id)
    SELECT s.session_id, coalesce(src.source_tokens, 0) AS source_tokens,
           coalesce(c.model_calls, 0) AS model_calls, coalesce(c.failed_calls, 0) AS failed_calls,
           coalesce(c.input_tokens, 0) AS input_tokens, coalesce(c.cached_tokens, 0) AS cached_tokens,
           coalesce(c.input_tokens, 0) - coalesce(c.cached_tokens, 0) AS uncached_tokens,
           coalesce(c.output_tokens, 0) AS output_tokens,
           c.cost_usd, coalesce(c.unpriced_calls, 0) AS unpriced_calls,
           c.model_calls / nullif(c.stages_with_calls, 0) AS calls_per_stage,
           c.cost_usd * 1e6 / nullif(src.source_tokens, 0) AS usd_per_1m_source_tokens,
           1000.0 * c.input_tokens / nullif(src.source_tokens, 0) AS input_per_1k_source_tokens
    FROM om_internal.sessions s
    LEFT JOIN calls c ON c.session_id = s.session_id
    LEFT JOIN source src ON src.session_id = s.session_id;

CREATE OR REPLACE VIEW run_costs AS
    SELECT run_id, count(DISTINCT session_id) AS sessions,
           count(*) FILTER (WHERE status = 'ok') AS model_calls,
           coalesce(sum(input_tokens), 0) AS input_tokens, coalesce(sum(cached_tokens), 0) AS cached_tokens,
           coalesce(sum(output_tokens), 0) AS output_tokens, sum(cost) AS cost_usd,
           count(*) FILTER (WHERE status = 'ok' AND cost IS NULL) AS unpriced_calls,
           min(started_at) AS first_call_at, max(started_at) AS last_call_at
    FROM om_internal.llm_calls WHERE run_id IS NOT NULL GROUP BY run_id;
