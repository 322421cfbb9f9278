-- om's own tables move into a schema of their own, `om_internal`, so that the default schema `main`
-- holds only what the README documents for analysts: views and macros under one stable name each
-- (the way dlt keeps its system tables apart from the user's). `om sql` still reads an internal
-- table by its qualified name, but analysts are pointed at the views.
--
-- The name: `om_internal` says whose and what it is, and is no DuckDB keyword. Not `om` or `store`:
-- DuckDB names a database file's catalog after the file, and a schema with the same name as the
-- catalog makes every `x.table` ambiguous (the default file is om.duckdb).
--
-- One name per concept: an internal table is named like the public view that shows its rows
-- (om_internal.ledger under ledger, om_internal.llm_calls under llm_calls, …), one view row per table
-- row, so a search for a concept finds its table and its view together and the schema says which
-- is which. A view may add columns of its parent row (observations carries its record's
-- watermark) or rows om does not store itself (compactions adds Pi's own compaction entries);
-- what om stores of a concept is still that concept. Tables analysts never see keep their names.
--   ledger_records -> ledger          ledger_observations -> observations
--   ledger_reflections -> reflections ledger_drops -> drops
--   compaction_folds -> compactions   compaction_fold_items -> compaction_items
--   stage_runs -> stages              model_calls -> llm_calls
--   model_call_texts -> llm_call_texts
--
-- DuckDB cannot move a table between schemas (no ALTER TABLE … SET SCHEMA), so every table is
-- created anew with its columns, constraints and defaults as migrations 001-007 left them, its rows
-- copied by name, and the old table dropped. The record-order sequence moves too and continues
-- after every position already taken. The views and macros in main are re-created over the new
-- tables right after the migrations (om_core.store.db.ensure_views). A new database does not run this
-- file: it is built from sql/schema/current.sql, the schema as it stands.

CREATE SCHEMA IF NOT EXISTS om_internal;  -- the bookkeeping may have created it (om_core.store.db)

CREATE SEQUENCE om_internal.ledger_append_seq START 1;
SELECT count(nextval('om_internal.ledger_append_seq'))
FROM (SELECT coalesce(last_value, 0) AS taken FROM duckdb_sequences()
      WHERE database_name = current_database() AND schema_name = 'main'
        AND sequence_name = 'ledger_append_seq') s,
     range(s.taken);

-- Sessions as Pi stores them (001, 004)

CREATE TABLE om_internal.runs (
    run_id       VARCHAR PRIMARY KEY,
    command      VARCHAR NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
    finished_at  TIMESTAMPTZ,
    status       VARCHAR NOT NULL DEFAULT 'running',  -- running | ok | failed | interrupted | abandoned
    detail       JSON,
    pid          INTEGER,
    host         VARCHAR,
    child_pids   INTEGER[]
);
INSERT INTO om_internal.runs BY NAME SELECT * FROM main.runs;
DROP TABLE main.runs;

CREATE TABLE om_internal.session_files (
    file_path       VARCHAR PRIMARY KEY,
    session_id      VARCHAR,
    status          VARCHAR NOT NULL,          -- ingested | no_header | duplicate_session
    size_bytes      BIGINT NOT NULL,
    mtime_ns        BIGINT NOT NULL,
    ingested_bytes  BIGINT NOT NULL,           -- end of the last complete line read
    ingested_lines  BIGINT NOT NULL,
    prefix_sha256   VARCHAR NOT NULL,          -- hash of bytes [0, ingested_bytes): detects rewrites
    parser_state    JSON,                      -- what the reader needs to continue after an append
    run_id          VARCHAR,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);
INSERT INTO om_internal.session_files BY NAME SELECT * FROM main.session_files;
DROP TABLE main.session_files;

CREATE TABLE om_internal.sessions (
    session_id      VARCHAR PRIMARY KEY,
    file_path       VARCHAR NOT NULL,
    version         INTEGER NOT NULL,          -- as written in the file (1 when absent)
    cwd             VARCHAR,
    started_at      TIMESTAMPTZ,
    parent_session  VARCHAR,
    leaf_id         VARCHAR,                   -- current leaf: last entry in file order
    entry_count     INTEGER NOT NULL,
    source_count    INTEGER NOT NULL,
    leaf_count      INTEGER NOT NULL,
    tokens_pi       BIGINT,
    tokens          BIGINT,
    header          VARCHAR NOT NULL,
    run_id          VARCHAR,
    ingested_at     TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);
INSERT INTO om_internal.sessions BY NAME SELECT * FROM main.sessions;
DROP TABLE main.sessions;

-- Big tables have no primary keys: uniqueness is kept by the ingest code, and rows of one session
-- stay contiguous (copied in their stored order) so DuckDB's zone maps skip other sessions.
CREATE TABLE om_internal.entries (
    session_id           VARCHAR NOT NULL,
    entry_id             VARCHAR NOT NULL,
    parent_id            VARCHAR,              -- as Pi holds it after migration (minted for v1)
    line_no              INTEGER NOT NULL,     -- 1-based line in the file, header = 1
    entry_index          INTEGER NOT NULL,     -- Pi's parsed-entry index, header = 0
    entry_type           VARCHAR,
    role                 VARCHAR,
    ts                   TIMESTAMPTZ,
    is_source            BOOLEAN NOT NULL,
    tokens_pi            INTEGER,              -- Pi's chars/4 estimate (source entries only)
    tokens               INTEGER,              -- tiktoken count (source entries only)
    first_kept_entry_id  VARCHAR,
    custom_type          VARCHAR,
    raw                  VARCHAR NOT NULL,     -- the line exactly as written
    run_id               VARCHAR
);
INSERT INTO om_internal.entries BY NAME SELECT * FROM main.entries;
DROP TABLE main.entries;

CREATE TABLE om_internal.entry_tree (
    session_id  VARCHAR NOT NULL,
    entry_id    VARCHAR NOT NULL,
    depth       INTEGER NOT NULL,              -- its position on every branch through it (0 = a root)
    pre         INTEGER NOT NULL,              -- depth-first preorder number within the session
    last        INTEGER NOT NULL,              -- the largest preorder number in its subtree
    is_leaf     BOOLEAN NOT NULL
);
INSERT INTO om_internal.entry_tree BY NAME SELECT * FROM main.entry_tree;
DROP TABLE main.entry_tree;

CREATE TABLE om_internal.quarantine (
    file_path       VARCHAR NOT NULL,
    session_id      VARCHAR,
    line_no         INTEGER,
    reason          VARCHAR NOT NULL,
    detail          VARCHAR,
    raw             BLOB,
    run_id          VARCHAR,
    quarantined_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);
INSERT INTO om_internal.quarantine BY NAME SELECT * FROM main.quarantine;
DROP TABLE main.quarantine;

CREATE TABLE om_internal.ingest_notes (
    session_id  VARCHAR,
    file_path   VARCHAR,
    line_no     INTEGER,
    entry_id    VARCHAR,
    kind        VARCHAR NOT NULL,
    detail      VARCHAR,
    run_id      VARCHAR
);
INSERT INTO om_internal.ingest_notes BY NAME SELECT * FROM main.ingest_notes;
DROP TABLE main.ingest_notes;

-- The memory ledger and folded compactions (002)

CREATE TABLE om_internal.ledger (
    session_id        VARCHAR NOT NULL,
    ledger_id         VARCHAR NOT NULL,   -- the entry id (imported) or a minted id (pipeline)
    kind              VARCHAR NOT NULL,   -- wire customType: om.observations.recorded | om.reflections.recorded | om.observations.dropped
    covers_up_to_id   VARCHAR NOT NULL,   -- progress watermark, not provenance
    anchor_entry_id   VARCHAR NOT NULL,
    append_seq        BIGINT NOT NULL DEFAULT nextval('om_internal.ledger_append_seq'),
    origin            VARCHAR NOT NULL,   -- imported | pipeline
    created_at        TIMESTAMPTZ,
    run_id            VARCHAR,
    stage             VARCHAR,            -- pipeline: observer | reflector | dropper
    stage_key         VARCHAR,            -- pipeline: hash of the exact stage input (exactly-once)
    PRIMARY KEY (session_id, ledger_id)
);
INSERT INTO om_internal.ledger BY NAME SELECT * FROM main.ledger_records;
DROP TABLE main.ledger_records;

CREATE TABLE om_internal.observations (
    session_id        VARCHAR NOT NULL,
    ledger_id         VARCHAR NOT NULL,
    item_index        INTEGER NOT NULL,
    obs_id            VARCHAR NOT NULL,
    content           VARCHAR NOT NULL,
    ts                VARCHAR NOT NULL,   -- YYYY-MM-DD HH:MM as written
    relevance         VARCHAR NOT NULL,
    source_entry_ids  VARCHAR[] NOT NULL,
    token_count       DOUBLE NOT NULL
);
INSERT INTO om_internal.observations BY NAME SELECT * FROM main.ledger_observations;
DROP TABLE main.ledger_observations;

CREATE TABLE om_internal.reflections (
    session_id                   VARCHAR NOT NULL,
    ledger_id                    VARCHAR NOT NULL,
    item_index                   INTEGER NOT NULL,
    refl_id                      VARCHAR NOT NULL,
    content                      VARCHAR NOT NULL,
    supporting_observation_ids   VARCHAR[] NOT NULL,
    token_count                  DOUBLE NOT NULL
);
INSERT INTO om_internal.reflections BY NAME SELECT * FROM main.ledger_reflections;
DROP TABLE main.ledger_reflections;

CREATE TABLE om_internal.drops (
    session_id   VARCHAR NOT NULL,
    ledger_id    VARCHAR NOT NULL,
    item_index   INTEGER NOT NULL,
    obs_id       VARCHAR NOT NULL
);
INSERT INTO om_internal.drops BY NAME SELECT * FROM main.ledger_drops;
DROP TABLE main.ledger_drops;

-- Compactions om holds om.folded memory for: the extension's (imported: the compaction entry's
-- details) and this project's simulated ones. folded = false: an empty projection, Pi's native
-- summarizer runs.
CREATE TABLE om_internal.compactions (
    session_id           VARCHAR NOT NULL,
    compaction_id        VARCHAR NOT NULL,
    origin               VARCHAR NOT NULL,   -- imported | simulated
    anchor_entry_id      VARCHAR NOT NULL,
    append_seq           BIGINT NOT NULL DEFAULT nextval('om_internal.ledger_append_seq'),
    first_kept_entry_id  VARCHAR,
    folded               BOOLEAN NOT NULL,
    full_fold            BOOLEAN,
    summary              VARCHAR,
    note                 VARCHAR,
    trigger              VARCHAR,            -- simulated: proactive | archive | manual
    gap_safe             BOOLEAN,
    plain_first_kept_entry_id VARCHAR,       -- simulated gap-safe: the boundary Pi chose
    created_at           TIMESTAMPTZ,
    run_id               VARCHAR,
    PRIMARY KEY (session_id, compaction_id)
);
INSERT INTO om_internal.compactions BY NAME SELECT * FROM main.compaction_folds;
DROP TABLE main.compaction_folds;

CREATE TABLE om_internal.compaction_items (
    session_id                   VARCHAR NOT NULL,
    compaction_id                VARCHAR NOT NULL,
    item_kind                    VARCHAR NOT NULL,   -- observation | reflection
    item_index                   INTEGER NOT NULL,
    id                           VARCHAR NOT NULL,
    content                      VARCHAR NOT NULL,
    ts                           VARCHAR,
    relevance                    VARCHAR,
    source_entry_ids             VARCHAR[],
    supporting_observation_ids   VARCHAR[],
    token_count                  DOUBLE NOT NULL
);
INSERT INTO om_internal.compaction_items BY NAME SELECT * FROM main.compaction_fold_items;
DROP TABLE main.compaction_fold_items;

CREATE TABLE om_internal.ledger_rejects (
    session_id   VARCHAR NOT NULL,
    entry_id     VARCHAR NOT NULL,
    kind         VARCHAR,
    reason       VARCHAR NOT NULL,
    run_id       VARCHAR
);
INSERT INTO om_internal.ledger_rejects BY NAME SELECT * FROM main.ledger_rejects;
DROP TABLE main.ledger_rejects;

DROP SEQUENCE main.ledger_append_seq;

-- Worker stages and model calls (003, 005, 006)

CREATE TABLE om_internal.stages (
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
INSERT INTO om_internal.stages BY NAME SELECT * FROM main.stage_runs;
DROP TABLE main.stage_runs;

CREATE TABLE om_internal.llm_calls (
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
INSERT INTO om_internal.llm_calls BY NAME SELECT * FROM main.model_calls;
DROP TABLE main.model_calls;

-- The text of every model call, joined on call_id; a failed call has no response.
CREATE TABLE om_internal.llm_call_texts (
    call_id     VARCHAR PRIMARY KEY,
    run_id      VARCHAR,
    request     VARCHAR NOT NULL,       -- JSON: {"messages": [...], "tools": [...]}
    response    VARCHAR                 -- JSON: {"content": ..., "tool_calls": [{"id", "name", "arguments"}]}
);
INSERT INTO om_internal.llm_call_texts BY NAME SELECT * FROM main.model_call_texts;
DROP TABLE main.model_call_texts;

-- A computed stage result not yet appended survives a crash here (commands; exactly-once).
CREATE TABLE om_internal.stage_results (
    session_id   VARCHAR NOT NULL,
    stage_key    VARCHAR NOT NULL,
    stage        VARCHAR NOT NULL,
    result       VARCHAR NOT NULL,          -- JSON of the proposed records
    created_at   TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (session_id, stage_key)
);
INSERT INTO om_internal.stage_results BY NAME SELECT * FROM main.stage_results;
DROP TABLE main.stage_results;

-- What each session's last complete replay started from (005).
CREATE TABLE om_internal.session_replays (
    session_id   VARCHAR PRIMARY KEY,
    fingerprint  VARCHAR NOT NULL,
    run_id       VARCHAR,
    replayed_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);
INSERT INTO om_internal.session_replays BY NAME SELECT * FROM main.session_replays;
DROP TABLE main.session_replays;
