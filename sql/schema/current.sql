-- The schema as it stands: om's tables and the record-order sequence, in the om_internal schema,
-- exactly as a new database gets them.
--
-- Every new database (the user's new file, each replay's in-memory database, every test's) is built
-- from this file and recorded as being at the latest migration, with every migration listed as
-- applied (om_core.store.db.build_schema). The numbered migrations in sql/migrations/ only upgrade a file
-- that already exists: a file at version N runs N+1 up to the latest. Both kinds of database then
-- get the views and macros of sql/views/ (om_core.store.db.ensure_views); the bookkeeping tables
-- (om_internal.schema_migrations, om_internal.om_meta) come from sql/queries/db.sql in both.
--
-- The rule: a schema change is a new numbered migration AND the same change made here. The test
-- tests/test_db.py::test_the_snapshot_equals_every_migration_applied builds one database from this
-- file and one by running every migration from 001, and compares their catalogs (tables, columns and
-- their types, defaults, keys, not-null and check constraints, sequences, indexes, views, macros);
-- any difference fails it.
--
-- Big tables have no primary keys: uniqueness is kept by the ingest code, and rows of one session
-- stay contiguous so DuckDB's zone maps skip other sessions.

CREATE SCHEMA IF NOT EXISTS om_internal;  -- the bookkeeping has created it already (om_core.store.db)

CREATE SEQUENCE om_internal.ledger_append_seq START 1;  -- append_seq: the order records were written

-- Sessions as Pi stores them

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

CREATE TABLE om_internal.entry_tree (
    session_id  VARCHAR NOT NULL,
    entry_id    VARCHAR NOT NULL,
    depth       INTEGER NOT NULL,              -- its position on every branch through it (0 = a root)
    pre         INTEGER NOT NULL,              -- depth-first preorder number within the session
    last        INTEGER NOT NULL,              -- the largest preorder number in its subtree
    is_leaf     BOOLEAN NOT NULL
);

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

CREATE TABLE om_internal.ingest_notes (
    session_id  VARCHAR,
    file_path   VARCHAR,
    line_no     INTEGER,
    entry_id    VARCHAR,
    kind        VARCHAR NOT NULL,
    detail      VARCHAR,
    run_id      VARCHAR
);

-- The memory ledger and folded compactions

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

CREATE TABLE om_internal.observations (
    session_id        VARCHAR NOT NULL,
    ledger_id         VARCHAR NOT NULL,
    item_index        INTEGER NOT NULL,
    obs_id            VARCHAR NOT NULL,
    content           VARCHAR NOT NULL,
    ts                VARCHAR NOT NULL,   -- YYYY-MM-DD HH:MM as written
    relevance         VARCHAR NOT NULL,
    source_entry_ids  VARCHAR[] NOT NULL,
    token_count       DOUBLE NOT NULL,
    ts_repaired_from  VARCHAR             -- the model's time, when om replaced it (outside its sources' times)
);

CREATE TABLE om_internal.reflections (
    session_id                   VARCHAR NOT NULL,
    ledger_id                    VARCHAR NOT NULL,
    item_index                   INTEGER NOT NULL,
    refl_id                      VARCHAR NOT NULL,
    content                      VARCHAR NOT NULL,
    supporting_observation_ids   VARCHAR[] NOT NULL,
    token_count                  DOUBLE NOT NULL
);

CREATE TABLE om_internal.drops (
    session_id   VARCHAR NOT NULL,
    ledger_id    VARCHAR NOT NULL,
    item_index   INTEGER NOT NULL,
    obs_id       VARCHAR NOT NULL,
    reason       VARCHAR              -- the dropper's reason for its record's drops
);

-- Reflection drops (SPEC §13): the items of om.reflections.dropped records, each a reflection id the
-- record tombstones (folded like observation drops: it leaves the active reflections and stays
-- recallable). replaced_by and kind are what some versions of the extension add to the record, kept
-- as the JSON they were (a retirement by a newer reflection names it in replaced_by).
CREATE TABLE om_internal.reflection_drops (
    session_id   VARCHAR NOT NULL,
    ledger_id    VARCHAR NOT NULL,
    item_index   INTEGER NOT NULL,
    refl_id      VARCHAR NOT NULL,
    reason       VARCHAR,              -- the reflection dropper's reason for its record's drops
    replaced_by  VARCHAR,              -- the record's replacedBy, as JSON text (NULL: absent)
    kind         VARCHAR               -- the record's kind, as JSON text (NULL: absent)
);

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

CREATE TABLE om_internal.ledger_rejects (
    session_id   VARCHAR NOT NULL,
    entry_id     VARCHAR NOT NULL,
    kind         VARCHAR,
    reason       VARCHAR NOT NULL,
    run_id       VARCHAR
);

-- Worker stages and model calls

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
    started_at      TIMESTAMPTZ NOT NULL,
    fallback        BOOLEAN DEFAULT false  -- made by the fallbackModel (SPEC §13)
);

-- The text of every model call, joined on call_id; a failed call has no response.
CREATE TABLE om_internal.llm_call_texts (
    call_id     VARCHAR PRIMARY KEY,
    run_id      VARCHAR,
    request     VARCHAR NOT NULL,       -- JSON: {"messages": [...], "tools": [...]}
    response    VARCHAR                 -- JSON: {"content": ..., "tool_calls": [{"id", "name", "arguments"}]}
);

-- A computed stage result not yet appended survives a crash here (commands; exactly-once).
CREATE TABLE om_internal.stage_results (
    session_id   VARCHAR NOT NULL,
    stage_key    VARCHAR NOT NULL,
    stage        VARCHAR NOT NULL,
    result       VARCHAR NOT NULL,          -- JSON of the proposed records
    created_at   TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (session_id, stage_key)
);

-- Entry ids Pi's migration (or a pi --fork copy) replaced, and what om re-anchored to (migration 010).
CREATE TABLE om_internal.entry_id_map (
    session_id       VARCHAR NOT NULL,   -- the session whose references now use new_id
    from_session_id  VARCHAR NOT NULL,   -- where old_id was: the same session (migrated) or a fork's source
    old_id           VARCHAR NOT NULL,
    new_id           VARCHAR NOT NULL,
    how              VARCHAR NOT NULL,   -- migrated | forked
    run_id           VARCHAR,
    mapped_at        TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

-- A rewritten v1/v2 session's entries until the new file is compared with them.
CREATE TABLE om_internal.replaced_entries (
    session_id           VARCHAR NOT NULL,
    version              INTEGER NOT NULL,   -- the session's version before the rewrite
    entry_id             VARCHAR NOT NULL,
    parent_id            VARCHAR,
    entry_index          INTEGER NOT NULL,
    entry_type           VARCHAR,
    first_kept_entry_id  VARCHAR,
    raw                  VARCHAR NOT NULL
);

-- What each session's last complete replay started from.
CREATE TABLE om_internal.session_replays (
    session_id   VARCHAR PRIMARY KEY,
    fingerprint  VARCHAR NOT NULL,
    run_id       VARCHAR,
    replayed_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

-- Projects, the project ledger and the search index (migration 011).
CREATE TABLE om_internal.project_sessions (
    session_id   VARCHAR PRIMARY KEY,
    cwd          VARCHAR,              -- the session header's cwd, as written
    git_root     VARCHAR,              -- the top folder of the git work tree holding cwd (NULL: none found)
    git_remote   VARCHAR,              -- that repository's remote URL (origin first), without credentials
    project_id   VARCHAR,              -- the project (NULL: the session names no cwd)
    how          VARCHAR NOT NULL,     -- setting | git_remote | git_root | path | none
    resolved_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

-- The project ledger: append-only like a session's, in append order (append_seq, from the one
-- record-order sequence). A record's watermark is the session ledger's record order its stage read its
-- input through: the project's sessions' records appended after it are what is new.

CREATE TABLE om_internal.project_ledger (
    project_id        VARCHAR NOT NULL,
    ledger_id         VARCHAR NOT NULL,
    kind              VARCHAR NOT NULL,  -- om.project.reflections.recorded | om.project.reflections.retired
    covers_up_to_seq  BIGINT NOT NULL,   -- input watermark: session records through this append_seq were read
    append_seq        BIGINT NOT NULL DEFAULT nextval('om_internal.ledger_append_seq'),
    origin            VARCHAR NOT NULL,  -- pipeline | user (om forget --project)
    created_at        TIMESTAMPTZ,
    run_id            VARCHAR,
    stage             VARCHAR,           -- project | forget
    stage_key         VARCHAR,           -- pipeline: hash of the exact stage input (exactly-once)
    PRIMARY KEY (project_id, ledger_id)
);

CREATE TABLE om_internal.project_reflections (
    project_id      VARCHAR NOT NULL,
    ledger_id       VARCHAR NOT NULL,
    item_index      INTEGER NOT NULL,
    refl_id         VARCHAR NOT NULL,
    content         VARCHAR NOT NULL,
    supporting_ids  VARCHAR[] NOT NULL,  -- the session memory ids (reflections, observations) it rests on
    token_count     DOUBLE NOT NULL
);

CREATE TABLE om_internal.project_retirements (
    project_id   VARCHAR NOT NULL,
    ledger_id    VARCHAR NOT NULL,
    item_index   INTEGER NOT NULL,
    refl_id      VARCHAR NOT NULL,
    reason       VARCHAR              -- superseded by [id], the model's reason, or the user's (om forget)
);

-- Every project stage: what it read through, what it did (its model calls: llm_calls.stage_run_id).
CREATE TABLE om_internal.project_stages (
    stage_run_id      VARCHAR PRIMARY KEY,
    run_id            VARCHAR,
    project_id        VARCHAR NOT NULL,
    stage_key         VARCHAR NOT NULL,
    model             VARCHAR NOT NULL,
    outcome           VARCHAR NOT NULL,  -- recorded | empty | failed
    covers_up_to_seq  BIGINT NOT NULL,   -- the input's watermark (an empty result waits for more input)
    inputs            INTEGER NOT NULL,  -- session memory items read
    input_tokens      DOUBLE NOT NULL,   -- their tokens
    records           INTEGER NOT NULL DEFAULT 0,
    items             INTEGER NOT NULL DEFAULT 0,
    rejected          INTEGER NOT NULL DEFAULT 0,
    error_kind        VARCHAR,
    error             VARCHAR,
    receipts          VARCHAR,
    started_at        TIMESTAMPTZ NOT NULL,
    finished_at       TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

-- Search: each searchable text (an observation, a reflection, a source entry, a project reflection)
-- as its terms, kept up to date by every writer (om_core.recall.search), so a search reads only these.
CREATE TABLE om_internal.search_documents (
    doc_kind  VARCHAR NOT NULL,   -- observation | reflection | entry | project_reflection
    scope_id  VARCHAR NOT NULL,   -- the session (observation, reflection, entry) or project
    doc_id    VARCHAR NOT NULL,   -- the memory id, or the entry id
    length    INTEGER NOT NULL    -- its number of terms
);

CREATE TABLE om_internal.search_terms (
    doc_kind  VARCHAR NOT NULL,
    scope_id  VARCHAR NOT NULL,
    doc_id    VARCHAR NOT NULL,
    term      VARCHAR NOT NULL,
    tf        INTEGER NOT NULL    -- how often the term occurs in the text
);

-- Recall by meaning: each indexed document's embedding (recallEmbeddings on, the embeddings extra
-- installed), kept by the writers beside its search terms (om_core.recall.vectors; migration 012).
CREATE TABLE om_internal.search_vectors (
    doc_kind  VARCHAR NOT NULL,   -- as om_internal.search_documents
    scope_id  VARCHAR NOT NULL,
    doc_id    VARCHAR NOT NULL,
    model     VARCHAR NOT NULL,   -- the embedding model (library/config/dimensions)
    vec       FLOAT[] NOT NULL    -- unit length: cosine similarity is their dot product
);
