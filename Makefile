# The two commands a newcomer needs: `make demo` and `make test`. Both build the venv themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pitstop-installed
RUN_STAMP := $(VENV)/.pitstop-runtime-installed

.PHONY: demo test lint unit deps real-vllm clean help

help:
	@echo "make demo   - control plane + agent + four simulated vLLM replicas + console + load and faults, until Ctrl-C"
	@echo "make test   - lint, type-check and run the whole test suite"
	@echo "make unit   - only the fast tests (no real processes)"

# Reinstall when the project's metadata changes; the editable install picks up code changes by itself.
# The demo needs only the runtime extras (quicker on a fresh machine); the tests need the dev tools too.
$(RUN_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[agent,server]'
	@touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP) $(RUN_STAMP)

deps: $(STAMP)
	@bash scripts/ensure-debian-packages.sh

# A real vLLM (CPU build) and a tiny local model for the tests that supervise a real engine; cached in .pitstop/.
real-vllm:
	@bash scripts/setup-real-vllm.sh

demo: $(RUN_STAMP)
	$(BIN)/pitstop demo

# amtool comes with Debian's prometheus-alertmanager (`make deps`). It fails rather than skips when missing:
# a config that was never checked would first be found broken by the Alertmanager loading it.
lint: deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_payload_keys.py
	$(BIN)/python -m pitstop.boards --check
	@command -v amtool >/dev/null || { echo "amtool not found: run make deps (Debian package prometheus-alertmanager)"; exit 1; }
	amtool check-config alerts/alertmanager.yml

# The suite runs in TEST_WORKERS pytest-xdist workers side by side (tests/conftest.py keeps them apart; a test
# marked solo runs alone). Two by default: most slow tests wait on timers, so two workers fill two cores better
# than one. TEST_WORKERS=1 runs everything in one process, one test after another.
TEST_WORKERS ?= 2

# The real vLLM's download and install runs beside the venv, the Debian packages and the lint: on a fresh
# machine they wait on the network and the disk, not on each other.
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target real-vllm lint
	$(BIN)/pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)

unit: $(STAMP)
	$(BIN)/pytest -m 'not slow'

clean:
	rm -rf $(VENV) .pitstop .mypy_cache .ruff_cache .pytest_cache
