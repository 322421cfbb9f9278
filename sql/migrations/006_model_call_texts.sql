-- The text of every model call (issue 12): the request as sent (after redaction: messages and
-- tools) and the response (the assistant's text and tool calls), one row per model_calls row,
-- joined on call_id. The storePrompts setting turns it off; a failed call has no response.
CREATE TABLE model_call_texts (
    call_id     VARCHAR PRIMARY KEY,
    run_id      VARCHAR,
    request     VARCHAR NOT NULL,       -- JSON: {"messages": [...], "tools": [...]}
    response    VARCHAR                 -- JSON: {"content": ..., "tool_calls": [{"id", "name", "arguments"}]}
);
