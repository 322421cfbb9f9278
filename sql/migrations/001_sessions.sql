-- Sessions as Pi stores them: files, sessions, entries, branches, and what was kept aside.
-- Big tables have no primary keys: uniqueness is kept by the ingest code, and rows of one session
-- stay contiguous so DuckDB's zone maps skip other sessions.

CREATE TABLE runs (
    run_id       VARCHAR PRIMARY KEY,
    command      VARCHAR NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
    finished_at  TIMESTAMPTZ,
    status       VARCHAR NOT NULL DEFAULT 'running',  -- running | ok | failed
    detail       JSON
);

CREATE TABLE session_files (
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

CREATE TABLE sessions (
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

CREATE TABLE entries (
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

CREATE TABLE branch_entries (
    session_id  VARCHAR NOT NULL,
    leaf_id     VARCHAR NOT NULL,
    position    INTEGER NOT NULL,              -- 0-based from the root
    entry_id    VARCHAR NOT NULL
);

CREATE TABLE quarantine (
    file_path       VARCHAR NOT NULL,
    session_id      VARCHAR,
    line_no         INTEGER,
    reason          VARCHAR NOT NULL,
    detail          VARCHAR,
    raw             BLOB,
    run_id          VARCHAR,
    quarantined_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

-- Entries that were kept but needed repair to form a tree (dangling parents, cycles), and other
-- remarks of the ingest that are not rejections.
CREATE TABLE ingest_notes (
    session_id  VARCHAR,
    file_path   VARCHAR,
    line_no     INTEGER,
    entry_id    VARCHAR,
    kind        VARCHAR NOT NULL,
    detail      VARCHAR,
    run_id      VARCHAR
);
