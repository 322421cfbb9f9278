-- A payload's rows of a table into a replay's in-memory database.
INSERT INTO om_internal.{table} BY NAME SELECT * FROM payload_batch;
