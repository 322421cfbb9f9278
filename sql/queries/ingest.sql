-- name: get_session_file
SELECT file_path, session_id, status, size_bytes, mtime_ns, ingested_bytes, ingested_lines,
       prefix_sha256, parser_state
FROM om_internal.session_files WHERE file_path = $file_path;

-- name: session_file_of_session
SELECT file_path FROM om_internal.session_files WHERE session_id = $session_id AND status = 'ingested';

-- name: upsert_session_file
INSERT OR REPLACE INTO om_internal.session_files
    (file_path, session_id, status, size_bytes, mtime_ns, ingested_bytes, ingested_lines,
     prefix_sha256, parser_state, run_id, updated_at)
VALUES ($file_path, $session_id, $status, $size_bytes, $mtime_ns, $ingested_bytes, $ingested_lines,
        $prefix_sha256, $parser_state, $run_id, current_timestamp);

-- name: touch_session_file
UPDATE om_internal.session_files SET size_bytes = $size_bytes, mtime_ns = $mtime_ns, updated_at = current_timestamp
WHERE file_path = $file_path;

-- name: delete_session_file
DELETE FROM om_internal.session_files WHERE file_path = $file_path;

-- name: delete_session_entries
DELETE FROM om_internal.entries WHERE session_id = $session_id;

-- name: delete_session_tree
DELETE FROM om_internal.entry_tree WHERE session_id = $session_id;

-- name: delete_session_notes
-- (the notes of the tree, derived anew; a rewrite's note, and what om followed of Pi's migration or a
-- fork, are the file's history and stay)
DELETE FROM om_internal.ingest_notes WHERE (session_id = $session_id OR file_path = $file_path)
  AND kind NOT IN ('rewritten', 'migrated', 'forked', 'not_forked');

-- name: delete_session_row
DELETE FROM om_internal.sessions WHERE session_id = $session_id;

-- name: delete_file_quarantine
DELETE FROM om_internal.quarantine WHERE file_path = $file_path;

-- name: delete_pending_tail
-- A truncated last line is re-read on the next ingest, so its quarantine row is provisional.
DELETE FROM om_internal.quarantine WHERE file_path = $file_path AND reason = 'truncated_last_line';

-- name: insert_entries
INSERT INTO om_internal.entries
    (session_id, entry_id, parent_id, line_no, entry_index, entry_type, role, ts, is_source, tokens_pi,
     tokens, first_kept_entry_id, custom_type, raw, run_id)
SELECT $session_id, entry_id, parent_id, line_no, entry_index, NULLIF(entry_type, ''), role,
       TRY_CAST(ts AS TIMESTAMPTZ), is_source, tokens_pi, tokens, first_kept_entry_id, custom_type,
       raw, $run_id
FROM entry_batch;

-- name: insert_quarantine
INSERT INTO om_internal.quarantine (file_path, session_id, line_no, reason, detail, raw, run_id)
SELECT $file_path, $session_id, line_no, reason, detail, raw, $run_id FROM quarantine_batch;

-- name: insert_note
INSERT INTO om_internal.ingest_notes (session_id, file_path, line_no, entry_id, kind, detail, run_id)
VALUES ($session_id, $file_path, $line_no, $entry_id, $kind, $detail, $run_id);

-- name: v1_ids_by_index_upto
-- The ids a v1 file's recorded lines were given (rows after them are an interrupted ingest's).
SELECT entry_index, entry_id FROM om_internal.entries WHERE session_id = $session_id AND line_no <= $line_no;

-- name: quarantine_duplicate_ids
-- Pi's id map keeps the later of two entries with one id; the earlier one is set aside.
INSERT INTO om_internal.quarantine (file_path, session_id, line_no, reason, detail, raw, run_id)
SELECT $file_path, e.session_id, e.line_no, 'duplicate_id',
       'id ' || e.entry_id || ' is used again on line ' || d.keep_line || '; Pi keeps the later entry',
       encode(e.raw), $run_id
FROM om_internal.entries e
JOIN (SELECT entry_id, max(line_no) AS keep_line FROM om_internal.entries
      WHERE session_id = $session_id GROUP BY entry_id HAVING count(*) > 1) d
  ON e.entry_id = d.entry_id AND e.line_no < d.keep_line
WHERE e.session_id = $session_id;

-- name: delete_duplicate_ids
DELETE FROM om_internal.entries
WHERE session_id = $session_id
  AND (entry_id, line_no) IN (
      SELECT e.entry_id, e.line_no FROM om_internal.entries e
      JOIN (SELECT entry_id, max(line_no) AS keep_line FROM om_internal.entries
            WHERE session_id = $session_id GROUP BY entry_id HAVING count(*) > 1) d
        ON e.entry_id = d.entry_id AND e.line_no < d.keep_line
      WHERE e.session_id = $session_id);

-- name: tree_rows
SELECT entry_id, parent_id, line_no FROM om_internal.entries WHERE session_id = $session_id ORDER BY line_no;

-- name: insert_entry_tree
INSERT INTO om_internal.entry_tree (session_id, entry_id, depth, pre, last, is_leaf)
SELECT $session_id, entry_id, depth, pre, last, is_leaf FROM tree_batch;

-- name: tree_append_check
-- Whether lines appended after line $line_no can extend the stored tree: its size against the old
-- entries (the tree the last ingest stored), old entries that share an id with a new one or name one
-- as their parent (a dangling parent that now resolves), and the tree's notes so far (a repaired tree
-- is derived whole again).
SELECT (SELECT count(*) FROM om_internal.entry_tree WHERE session_id = $session_id) AS size,
       (SELECT count(*) FROM om_internal.entries WHERE session_id = $session_id AND line_no <= $line_no) AS old_entries,
       (SELECT count(*) FROM om_internal.entries o
        WHERE o.session_id = $session_id AND o.line_no <= $line_no
          AND (o.entry_id IN (SELECT entry_id FROM om_internal.entries WHERE session_id = $session_id AND line_no > $line_no)
               OR o.parent_id IN (SELECT entry_id FROM om_internal.entries
                                  WHERE session_id = $session_id AND line_no > $line_no))) AS conflicts,
       (SELECT count(*) FROM om_internal.ingest_notes
        WHERE session_id = $session_id AND kind IN ('dangling_parent', 'parent_cycle')) AS tree_notes;

-- name: tree_rows_after
SELECT entry_id, parent_id, line_no FROM om_internal.entries
WHERE session_id = $session_id AND line_no > $line_no ORDER BY line_no;

-- name: tree_nodes
SELECT entry_id, depth, pre, last FROM om_internal.entry_tree
WHERE session_id = $session_id AND list_contains($entry_ids::VARCHAR[], entry_id);

-- name: shift_entry_tree
-- The old entries' intervals once the appended entries are laid out (tree_blocks: the new entries
-- below one old entry, at_pre/at_last its interval, NULL for the new roots): each interval moves by
-- the blocks before it, and grows by the blocks inside it; an entry given children is no leaf.
UPDATE om_internal.entry_tree AS t
SET pre = t.pre + s.pre_shift, last = t.last + s.last_shift, is_leaf = t.is_leaf AND NOT s.attached
FROM (SELECT n.entry_id,
             (SELECT coalesce(sum(b.size), 0) FROM tree_blocks b WHERE b.at_last < n.pre) AS pre_shift,
             (SELECT coalesce(sum(b.size), 0) FROM tree_blocks b
              WHERE b.at_last < n.last OR (b.at_last = n.last AND b.at_pre >= n.pre)) AS last_shift,
             n.entry_id IN (SELECT entry_id FROM tree_blocks WHERE entry_id IS NOT NULL) AS attached
      FROM om_internal.entry_tree n
      WHERE n.session_id = $session_id AND n.last >= (SELECT min(at_last) FROM tree_blocks)) AS s
WHERE t.session_id = $session_id AND t.entry_id = s.entry_id;

-- name: session_leaf_count
SELECT count(*) FILTER (WHERE is_leaf) FROM om_internal.entry_tree WHERE session_id = $session_id;

-- name: upsert_session
INSERT OR REPLACE INTO om_internal.sessions
    (session_id, file_path, version, cwd, started_at, parent_session, leaf_id, entry_count,
     source_count, leaf_count, tokens_pi, tokens, header, run_id, ingested_at)
SELECT $session_id, $file_path, $version, $cwd, TRY_CAST($started_at AS TIMESTAMPTZ), $parent_session,
       arg_max(entry_id, line_no), count(*), count(*) FILTER (WHERE is_source), $leaf_count,
       sum(tokens_pi), sum(tokens), $header, $run_id, current_timestamp
FROM om_internal.entries WHERE session_id = $session_id;

-- name: delete_entries_after
-- Entries an interrupted ingest committed beyond the offset recorded in session_files.
DELETE FROM om_internal.entries WHERE session_id = $session_id AND line_no > $line_no;

-- name: delete_quarantine_after
DELETE FROM om_internal.quarantine WHERE file_path = $file_path AND line_no > $line_no;

-- name: user_messages_with_images
-- (frozen with the data step: before migration 008 the tables are in main, named unqualified.)
-- Migration 007: the stored user messages whose Pi estimate changes under Pi 1.6 (images count).
SELECT session_id, entry_id, raw, tokens_pi FROM entries
WHERE entry_type = 'message' AND role = 'user' AND contains(raw, '"image"');

-- name: set_entry_tokens_pi
UPDATE entries SET tokens_pi = $tokens_pi WHERE session_id = $session_id AND entry_id = $entry_id;

-- name: resum_session_tokens_pi
UPDATE sessions SET tokens_pi = (SELECT sum(e.tokens_pi) FROM entries e WHERE e.session_id = $session_id)
WHERE session_id = $session_id;

-- name: set_memory_limit
-- The memory DuckDB may use on the ingest's own write connection (e.g. '268435456B').
SET memory_limit = $limit;

-- name: session_entry_hashes
SELECT entry_id, hash(raw) AS raw_hash FROM om_internal.entries WHERE session_id = $session_id;

-- name: orphaned_ledger_ids
SELECT ledger_id FROM orphaned_records_in($session_id) ORDER BY ledger_id;
