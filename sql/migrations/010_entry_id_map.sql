-- Memory follows Pi's own rewrites of a session file (issue 33 item 1, pi-sessions.md §1.5).
--
-- Pi 1.6 migrates a v1 or v2 file in place when it opens it: v1 entries get new random ids and
-- parent ids, hookMessage becomes custom, the header says version 3. om had minted its own ids for
-- those v1 entries (SPEC §1) and anchored its records and compactions to them. When the rewritten
-- file holds the same entries in the same order, om maps each id it knew to Pi's and rewrites the
-- references of what it appended (anchors, watermarks, source entry ids, first kept entries, the
-- stages' tips), so every view and macro joins them to the entries as before and no query resolves
-- anything; `pi --fork` copies get the source session's records the same way. Each id that changed
-- is kept here: which id an entry had before (model requests, stage keys and earlier exports name
-- it), and that the re-anchoring happened.
CREATE TABLE om_internal.entry_id_map (
    session_id       VARCHAR NOT NULL,   -- the session whose references now use new_id
    from_session_id  VARCHAR NOT NULL,   -- where old_id was: the same session (migrated) or a fork's source
    old_id           VARCHAR NOT NULL,
    new_id           VARCHAR NOT NULL,
    how              VARCHAR NOT NULL,   -- migrated | forked
    run_id           VARCHAR,
    mapped_at        TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

-- The entries of a v1 or v2 session whose file was rewritten, kept from the start of its re-read until
-- the file's last transaction has compared the new entries with them (a crash in between leaves them
-- for the next ingest of the file).
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
