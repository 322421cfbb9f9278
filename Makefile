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

demo: $(STAMP)
	rm -f $(DEMO_DB) $(DEMO_DB).wal
	$(BIN)/om --db $(DEMO_DB) ingest examples/sessions
	$(BIN)/om --db $(DEMO_DB) sessions

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_DB) $(DEMO_DB).wal .pytest_cache
