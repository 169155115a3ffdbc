# The two commands of the README's Quick start. Each does its own set-up on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast unit lint install bench docs soak deploy-soak flake

# Tests and tools write bytecode (and pytest its rewritten-assertion caches) even where the shell
# says not to: without them every test process and every end-to-end subprocess compiles again.
unexport PYTHONDONTWRITEBYTECODE

# The slowest tests of each run, printed at its end (where a flake's or a slowdown's cost shows first).
DURATIONS := --durations=25

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
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## Lint, type-check and run every test (unit, integration on real Postgres + Redis, end-to-end).
## PostgreSQL and Redis: the machine's on 5432/6379 if they answer, else private throwaway ones.
## The soak is not a test tier: `make soak` runs it (tests/e2e/test_soak.py's small form: -m soak).
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not soak" $(DURATIONS) $(PYTEST_ARGS)

## A contributor's loop: unit plus integration (real PostgreSQL + Redis, no end-to-end processes),
## without the tests marked slow and without lint (README, "Quick start"). It and `make unit` draw a
## quarter of each property test's examples (tests/support/examples.py); `make test` draws them all.
## Four workers on two cores: these tiers wait (ticks, timeouts, subprocesses, outages) for about
## half their time, which two workers leave idle (docs/testing.md, "Suite speed").
FAST_WORKERS ?= 4
test-fast: $(STAMP)
	RECEIPT_TEST_EXAMPLES=fast $(BIN)/python -m pytest -n $(FAST_WORKERS) --dist loadgroup -m "not slow and not soak" $(DURATIONS) tests/unit tests/integration $(PYTEST_ARGS)

## Rerun the suite, or the tests given, N times and list every test that failed at least once:
## `make flake N=5`, `make flake N=10 TESTS="tests/e2e/test_faults.py"`.
N ?= 5
flake: $(STAMP)
	$(BIN)/python -m devharness.flake $(N) $(TESTS) $(PYTEST_ARGS)

## The pure tier only: tests/unit (no database server, broker or processes; Redis in memory); seconds.
unit: $(STAMP)
	RECEIPT_TEST_EXAMPLES=fast $(BIN)/python -m pytest -q -n 2 tests/unit $(PYTEST_ARGS)

## Print every benchmark's figures (needs PostgreSQL and Redis on 127.0.0.1; a few minutes).
## The comparison with Procrastinate and Celery (issue 12) first; `make bench BENCH_ARGS=--quick` for a short run.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[test,bench]"
	$(BIN)/python -m bench.compare $(BENCH_ARGS)
	$(BIN)/python -m bench.scale
	$(BIN)/python bench/append_bench.py
	$(BIN)/python -m bench.runtime_bench
	$(BIN)/python bench/sandbox_bench.py
	$(BIN)/python bench/metrics_scrape_bench.py
	$(BIN)/python -m bench.objectives_bench
	$(BIN)/python -m bench.watchdog_bench

## Chaos soak: the production shape under compound faults (private Postgres + redis-server; ~10 min).
## SOAK_ARGS="--jobs 1500 --rate 15" for a shorter run; the figures are in docs/faults.md.
soak: $(STAMP)
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

## Deploy soak: 300 jobs of 10-60 s through 3 rolling deploys a minute apart (~6 min; the machine's
## PostgreSQL + a private redis-server). DEPLOY_SOAK_ARGS="--long-jobs 30 --rounds 2 --interval 20".
deploy-soak: $(STAMP)
	$(BIN)/python -m bench.deploy_soak $(DEPLOY_SOAK_ARGS)

## Regenerate the README's configuration table from app/config.py, docs/reliability.md's loop table
## from app/ops/loop_registry.py, and docs/security.md's authorization matrix from tests/support/authz_matrix.py.
docs: $(STAMP)
	$(BIN)/python -c "from app.config import settings_markdown_table as t; import re, pathlib; p = pathlib.Path('README.md'); s = p.read_text(); a, rest = s.split('<!-- config-table:start -->\n', 1); _, b = rest.split('<!-- config-table:end -->', 1); p.write_text(a + '<!-- config-table:start -->\n' + t() + '\n<!-- config-table:end -->' + b)"
	$(BIN)/python -c "from workers.loop_passes import write_docs_table; write_docs_table()"
	$(BIN)/python -m tests.support.authz_matrix
