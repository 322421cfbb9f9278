-- A table's rows of one session with their place in the record order (append_seq) renumbered 1..n
-- over the session's records and compactions together (a replay's payload).
WITH seqs AS (
    SELECT append_seq FROM om_internal.ledger WHERE session_id = $session_id
    UNION ALL SELECT append_seq FROM om_internal.compactions WHERE session_id = $session_id
), renumbered AS (SELECT append_seq, row_number() OVER (ORDER BY append_seq) AS local_seq FROM seqs)
SELECT t.* REPLACE (n.local_seq AS append_seq)
FROM om_internal.{table} t JOIN renumbered n USING (append_seq)
WHERE t.session_id = $session_id;
