-- A replay's new rows of a table into the user's database.
INSERT INTO om_internal.{table} BY NAME SELECT * FROM replay_batch;
