-- Project memory, search and forget (issue 35).
--
-- project_sessions: the repository each session worked in, resolved once from its header's cwd
-- when the session is first ingested (om_core.project.repository): the git work tree holding that folder and
-- its remote, when the folder existed then, else the path. The facts are kept as found; the project
-- a session belongs to follows from them and from the `projects` setting, and is assigned again by
-- every ingest (no filesystem is read for that).
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
