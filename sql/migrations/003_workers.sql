-- Worker stages and model calls (SPEC §8): every stage run and every model call is a row.

CREATE TABLE stage_runs (
    stage_run_id      VARCHAR PRIMARY KEY,
    run_id            VARCHAR,
    session_id        VARCHAR NOT NULL,
    stage             VARCHAR NOT NULL,     -- observer | reflector | dropper
    stage_key         VARCHAR NOT NULL,     -- hash of the exact stage input
    tip_entry_id      VARCHAR NOT NULL,     -- the branch entry the stage ran at (records anchor here)
    chunk_first_id    VARCHAR,              -- observer: first and last entry of the chunk
    chunk_last_id     VARCHAR,
    model             VARCHAR NOT NULL,
    outcome           VARCHAR NOT NULL,     -- recorded | empty | failed
    records           INTEGER NOT NULL DEFAULT 0,
    items             INTEGER NOT NULL DEFAULT 0,
    rejected          INTEGER NOT NULL DEFAULT 0,
    error_kind        VARCHAR,              -- transient | permanent
    error             VARCHAR,
    receipts          VARCHAR,
    started_at        TIMESTAMPTZ NOT NULL,
    finished_at       TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

CREATE TABLE model_calls (
    call_id         VARCHAR PRIMARY KEY,
    run_id          VARCHAR,
    stage_run_id    VARCHAR,
    session_id      VARCHAR,
    stage           VARCHAR,
    model           VARCHAR NOT NULL,
    turn            INTEGER NOT NULL,
    input_tokens    INTEGER,
    output_tokens   INTEGER,
    cached_tokens   INTEGER,
    cost            DOUBLE,                 -- USD, when litellm knows the model's price
    latency_ms      DOUBLE NOT NULL,
    status          VARCHAR NOT NULL,       -- ok | error
    error_kind      VARCHAR,
    error           VARCHAR,
    attempt         INTEGER NOT NULL DEFAULT 1,
    started_at      TIMESTAMPTZ NOT NULL
);

-- A computed stage result that has not been appended yet survives a crash here: the next run finds
-- it by stage_key and appends it without calling the model again (exactly-once).
CREATE TABLE stage_results (
    session_id   VARCHAR NOT NULL,
    stage_key    VARCHAR NOT NULL,
    stage        VARCHAR NOT NULL,
    result       VARCHAR NOT NULL,          -- JSON of the proposed records
    created_at   TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (session_id, stage_key)
);
