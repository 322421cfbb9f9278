-- A table's rows of one session (a replay's payload).
SELECT * FROM om_internal.{table} WHERE session_id = $session_id;
