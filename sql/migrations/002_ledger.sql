-- The memory ledger (SPEC §2) and folded compactions (SPEC §5), as rows.
-- A record sits on the tree at its anchor: an imported record is itself a `custom` entry (its anchor
-- is its own id); a record this project appends is anchored to the branch entry after which it was
-- appended. Branch order of records = anchor position, imported before pipeline, then append order.

CREATE SEQUENCE ledger_append_seq START 1;

CREATE TABLE ledger_records (
    session_id        VARCHAR NOT NULL,
    ledger_id         VARCHAR NOT NULL,   -- the entry id (imported) or a minted id (pipeline)
    kind              VARCHAR NOT NULL,   -- wire customType: om.observations.recorded | om.reflections.recorded | om.observations.dropped
    covers_up_to_id   VARCHAR NOT NULL,   -- progress watermark, not provenance
    anchor_entry_id   VARCHAR NOT NULL,
    append_seq        BIGINT NOT NULL DEFAULT nextval('ledger_append_seq'),
    origin            VARCHAR NOT NULL,   -- imported | pipeline
    created_at        TIMESTAMPTZ,
    run_id            VARCHAR,
    stage             VARCHAR,            -- pipeline: observer | reflector | dropper
    stage_key         VARCHAR,            -- pipeline: hash of the exact stage input (exactly-once)
    PRIMARY KEY (session_id, ledger_id)
);

CREATE TABLE ledger_observations (
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

CREATE TABLE ledger_reflections (
    session_id                   VARCHAR NOT NULL,
    ledger_id                    VARCHAR NOT NULL,
    item_index                   INTEGER NOT NULL,
    refl_id                      VARCHAR NOT NULL,
    content                      VARCHAR NOT NULL,
    supporting_observation_ids   VARCHAR[] NOT NULL,
    token_count                  DOUBLE NOT NULL
);

CREATE TABLE ledger_drops (
    session_id   VARCHAR NOT NULL,
    ledger_id    VARCHAR NOT NULL,
    item_index   INTEGER NOT NULL,
    obs_id       VARCHAR NOT NULL
);

-- Compactions that carry om.folded memory: the extension's (imported, themselves compaction
-- entries) and this project's simulated ones (anchored like pipeline records). A simulated
-- compaction whose projection rendered nothing is kept with folded = false (native fallback).
CREATE TABLE compaction_folds (
    session_id           VARCHAR NOT NULL,
    compaction_id        VARCHAR NOT NULL,
    origin               VARCHAR NOT NULL,   -- imported | simulated
    anchor_entry_id      VARCHAR NOT NULL,
    append_seq           BIGINT NOT NULL DEFAULT nextval('ledger_append_seq'),
    first_kept_entry_id  VARCHAR,
    folded               BOOLEAN NOT NULL,   -- false: empty projection, Pi's native summarizer runs
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

CREATE TABLE compaction_fold_items (
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

-- Ledger entries and om.* compaction details that were ignored (invalid, V2, unknown), for analysts.
CREATE TABLE ledger_rejects (
    session_id   VARCHAR NOT NULL,
    entry_id     VARCHAR NOT NULL,
    kind         VARCHAR,
    reason       VARCHAR NOT NULL,
    run_id       VARCHAR
);
