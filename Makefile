# The two commands a newcomer needs: `make demo` and `make test`. Both build the venv themselves.
SHELL := /bin/bash
PYTHON ?= python3
# Bytecode caches on, whatever the environment says: the suite starts hundreds of Python processes, and each pytest
# process rewrites the asserts of some 440 modules. With PYTHONDONTWRITEBYTECODE set, every one of them compiles
# from source each time (a collection took 19 s of CPU instead of 8).
unexport PYTHONDONTWRITEBYTECODE
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
	$(BIN)/python scripts/check_sample_keys.py
	$(BIN)/python -m pitstop.boards --check
	@command -v amtool >/dev/null || { echo "amtool not found: run make deps (Debian package prometheus-alertmanager)"; exit 1; }
	amtool check-config alerts/alertmanager.yml

# The suite runs in two parts. First every test not marked solo, in TEST_WORKERS pytest-xdist workers side by side
# (tests/conftest.py keeps them apart): most of them wait on timers, engines starting and policy rounds, and on two
# cores two workers left the machine half idle. Then the solo tests, one after another with nothing beside them:
# they time real engines and reaction times. TEST_WORKERS=1 runs the first part in one process.
TEST_WORKERS ?= 4
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)

# Only the venv and the Debian packages come before the tests. The lint (mypy takes a core for over a minute) and
# the real vLLM's download and install (three minutes, mostly waiting on the network and the disk) run beside the
# first part, which needs neither; the solo part, which needs the real vLLM, starts once both have ended, so
# nothing runs beside it. Each one's output is kept in .pitstop/ and shown after the first part. Every step runs
# even when another failed; the exit status is the first failure's.
test: deps
	@mkdir -p .pitstop; status=0; \
	$(MAKE) --no-print-directory lint > .pitstop/lint.log 2>&1 & lint=$$!; \
	$(MAKE) --no-print-directory real-vllm > .pitstop/real-vllm.log 2>&1 & vllm=$$!; \
	echo "$(BIN)/pytest -m 'not solo' $(XDIST)"; $(BIN)/pytest -m 'not solo' $(XDIST) || status=$$?; \
	wait $$lint; lint_status=$$?; echo "make lint (exit $$lint_status):"; cat .pitstop/lint.log; \
	[ $$status -ne 0 ] || status=$$lint_status; \
	wait $$vllm; vllm_status=$$?; echo "make real-vllm (exit $$vllm_status):"; tail -n 40 .pitstop/real-vllm.log; \
	[ $$status -ne 0 ] || status=$$vllm_status; \
	echo "$(BIN)/pytest -m solo"; $(BIN)/pytest -m solo || status=$$?; \
	exit $$status

unit: $(STAMP)
	$(BIN)/pytest -m 'not slow'

clean:
	rm -rf $(VENV) .pitstop .mypy_cache .ruff_cache .pytest_cache
