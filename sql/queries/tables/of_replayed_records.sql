-- A table's rows of the records a run's replay appended (joined to their ledger rows).
SELECT x.* FROM om_internal.{table} x JOIN om_internal.ledger r USING (session_id, ledger_id)
WHERE r.run_id = $run_id AND r.origin = 'pipeline';
