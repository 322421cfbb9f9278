-- Model routing (SPEC §13): each model call says whether the fallbackModel made it, after the
-- stage's own model failed or could not be resolved; ``model`` already names the model each call used.
ALTER TABLE om_internal.llm_calls ADD COLUMN fallback BOOLEAN DEFAULT false;
