-- Model calls and stage runs for analysts.

CREATE OR REPLACE VIEW llm_calls AS
    SELECT call_id, run_id, session_id, stage, model, turn, attempt, input_tokens, output_tokens,
           cached_tokens, cost, latency_ms, status, error_kind, error, started_at, stage_run_id, fallback
    FROM om_internal.llm_calls;

CREATE OR REPLACE VIEW stages AS
    SELECT stage_run_id, run_id, session_id, stage, outcome, model, tip_entry_id, chunk_first_id,
           chunk_last_id, records, items, rejected, error_kind, error, started_at, finished_at, stage_key
    FROM om_internal.stages;

-- The request and response of each model call (join llm_calls on call_id).
CREATE OR REPLACE VIEW llm_call_texts AS
    SELECT call_id, request, response FROM om_internal.llm_call_texts;
