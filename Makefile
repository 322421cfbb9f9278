# Two entry points: `make demo` and `make test`. Each builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DB ?= demo.duckdb

.PHONY: demo demo-memory test venv clean bench-smoke docs docs-gen docs-serve

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	# om's own bytecode, as a wheel's install leaves it: read even where PYTHONDONTWRITEBYTECODE is set
	# (every `om` process would otherwise compile its ~100 modules again, ~0.2 s of CPU)
	$(BIN)/python -m compileall -q flows om_core
	touch $(STAMP)

venv: $(STAMP)

# The pipeline on the project's sample sessions with the offline baseline, then one compaction
# summary and one recall (demo-memory). The samples are small, so the demo lowers the thresholds
# (OM_* settings) to let every worker and a compaction run. The sample files hold no om.folded
# compaction of their own, so the summary shown is the replay's latest simulated compaction of the
# longest sample (om view --replayed): what the extension would have shown, labelled as replayed.
DEMO_ENV := OM_OBSERVE_AFTER_TOKENS=4000 OM_REFLECT_AFTER_TOKENS=8000 OM_COMPACT_AFTER_TOKENS=30000 \
	OM_OBSERVATIONS_POOL_MAX_TOKENS=3000
DEMO_SESSION := examples/sessions/harbor-sync-long.jsonl
demo: $(STAMP)
	rm -f $(DEMO_DB) $(DEMO_DB).wal
	$(DEMO_ENV) $(BIN)/om --db $(DEMO_DB) run examples/sessions
	@$(MAKE) --no-print-directory demo-memory

# The demo's second half, on the database the run wrote (tests/test_demo.py runs the whole demo).
demo-memory:
	@echo; echo "== a compaction summary: the replay's latest simulated compaction (om view --replayed) =="; echo
	$(BIN)/om --db $(DEMO_DB) view --replayed $(DEMO_SESSION)
	@echo; echo "== the evidence behind its first observation (om recall) =="; echo
	$(BIN)/om --db $(DEMO_DB) recall $$($(BIN)/om --db $(DEMO_DB) view --replayed $(DEMO_SESSION) --json \
		| $(BIN)/python -c "import json, sys; print(json.load(sys.stdin)['observations'][0]['id'])")

# On every core (pytest-xdist): most tests wait on subprocesses, a model server or Prefect. The tests
# that share a costly fixture stay on one worker (tests/conftest.py: XDIST_GROUPS).
TEST_WORKERS ?= auto
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# Every benchmark script once at a tiny size (bench/smoke.py lists them), against the fake model only,
# two at a time: it shows that each still runs, not what it measures (bench/README.md).
BENCH_JOBS ?= 2
bench-smoke: $(STAMP)
	$(BIN)/python bench/smoke.py --jobs $(BENCH_JOBS)

# The documentation site (docs/, mkdocs.yml) in site/. Its reference pages (commands, settings, the
# analyst schema) are generated from the code: docs-gen rewrites them, and the suite fails when they
# drift (tests/test_docs.py). NO_MKDOCS_2_WARNING: material's end-of-life banner is no build warning.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
docs-gen: $(STAMP)
	$(BIN)/python -m docs_gen

docs: docs-gen
	$(MKDOCS) build --strict

docs-serve: docs-gen
	$(MKDOCS) serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) $(DEMO_DB) $(DEMO_DB).wal .pytest_cache site
