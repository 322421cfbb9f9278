# Two entry points: `make demo` and `make test`. Each builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DB ?= demo.duckdb

.PHONY: demo test venv clean bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The pipeline on the project's sample sessions with the offline baseline, then one compaction
# summary (the visible memory of the longest sample) and one recall. The samples are small, so the
# demo lowers the thresholds (OM_* settings) to let every worker and a compaction run.
DEMO_ENV := OM_OBSERVE_AFTER_TOKENS=4000 OM_REFLECT_AFTER_TOKENS=8000 OM_COMPACT_AFTER_TOKENS=30000 \
	OM_OBSERVATIONS_POOL_MAX_TOKENS=3000
demo: $(STAMP)
	rm -f $(DEMO_DB) $(DEMO_DB).wal
	$(DEMO_ENV) $(BIN)/om --db $(DEMO_DB) run examples/sessions
	@echo; echo "== compaction summary: what the agent sees after the last compaction (om view) =="; echo
	$(BIN)/om --db $(DEMO_DB) view examples/sessions/harbor-sync-long.jsonl
	@echo; echo "== the evidence behind its first observation (om recall) =="; echo
	$(BIN)/om --db $(DEMO_DB) recall $$($(BIN)/om --db $(DEMO_DB) sql "SELECT id FROM compaction_items \
		WHERE item_kind = 'observation' ORDER BY compaction_id, item_index LIMIT 1" --csv | tail -n 1)

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_DB) $(DEMO_DB).wal .pytest_cache
