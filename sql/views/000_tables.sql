-- The stored tables analysts read as they are, under their own names (migration 008 keeps om's
-- tables in om_internal; main holds only the documented views and macros). Every column, as stored.

CREATE OR REPLACE VIEW runs AS SELECT * FROM om_internal.runs;

CREATE OR REPLACE VIEW sessions AS SELECT * FROM om_internal.sessions;

CREATE OR REPLACE VIEW entries AS SELECT * FROM om_internal.entries;

CREATE OR REPLACE VIEW entry_tree AS SELECT * FROM om_internal.entry_tree;

CREATE OR REPLACE VIEW quarantine AS SELECT * FROM om_internal.quarantine;

CREATE OR REPLACE VIEW ingest_notes AS SELECT * FROM om_internal.ingest_notes;

CREATE OR REPLACE VIEW ledger_rejects AS SELECT * FROM om_internal.ledger_rejects;

CREATE OR REPLACE VIEW session_replays AS SELECT * FROM om_internal.session_replays;

CREATE OR REPLACE VIEW entry_id_map AS SELECT * FROM om_internal.entry_id_map;
