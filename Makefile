# Both targets install what they need into ./.venv on first use (Python 3.11+ is all `make dev`
# needs; `make test` also sets up or names what its browser and TypeScript tests need).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,eval]'
	touch $@

.PHONY: dev test lint prerequisites
dev: $(BIN)/.installed  ## start the service on the embedded stack (http://127.0.0.1:8080)
	$(BIN)/contextd dev

lint: $(BIN)/.installed  ## ruff, mypy, and the dependency rules (no import cycles, layers)
	$(BIN)/ruff check app tests migrations benchmarks examples integrations
	$(BIN)/ruff format --check app tests benchmarks examples integrations
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider tests/test_architecture.py

prerequisites:  ## Chromium (installed with apt-get as root) and Node.js 20+, or what to run
	@sh tests/support/prerequisites.sh

# The suite in two processes, each with its own embedded PostgreSQL and Valkey (pytest-xdist):
# docs/RESULTS.md, Test suite wall time.
test: lint prerequisites  ## every test, against real Postgres+pgvector and Valkey started by the test session
	$(BIN)/pytest -n 2
