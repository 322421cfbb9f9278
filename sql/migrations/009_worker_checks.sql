-- What the workers' checks did with a model's answer, kept beside the records (issue 32).
--   observations.ts_repaired_from: the time the model gave an observation when it lay outside its
--     cited entries' times and om replaced it with the first cited entry's time (NULL: kept as given);
--   drops.reason: the reason the dropper gave for its record's drops (NULL: none given).
-- Neither is part of the extension's wire records: om export leaves them out.
ALTER TABLE om_internal.observations ADD COLUMN ts_repaired_from VARCHAR;
ALTER TABLE om_internal.drops ADD COLUMN reason VARCHAR;
