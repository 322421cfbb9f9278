-- A replay's rows of a table that an earlier commit may hold already (a stage, a model call): kept once.
INSERT OR IGNORE INTO om_internal.{table} BY NAME SELECT * FROM replay_batch;
