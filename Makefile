# The two commands of the README's Quick start. Each does its own set-up on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

## Run the whole system on this machine (embedded: SQLite + a local broker; no services needed).
run: $(STAMP)
	$(BIN)/receipt up

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

## Lint, type-check and run every test (unit, integration on real Postgres + Redis, end-to-end).
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/append_bench.py
