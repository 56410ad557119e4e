# One-command set-up: every target creates .venv/ (if missing) and installs the project into it, once, with exactly
# the versions in requirements.lock. A second call reinstalls nothing unless pyproject.toml or the lock changed.
# `make lock` re-resolves the lock from pyproject.toml (after adding or bumping a dependency): commit both.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements.lock
LOCK_VENV := .lock-venv
PORT ?= 5000
# The reference committed in git: dvc.yaml's metrics files (the accuracies `dvc metrics diff` / `dvc exp show` compare a
# run against), the stages' detailed metrics beside them, and dvc.lock (so unchanged dependencies compare equal and
# `dvc exp show --only-changed` keeps only what a run changed). The manifests are not committed (docs/running.md, 'The
# committed baseline', says why).
BASELINE := results/tune/test_acc.json results/prune/test_acc.json results/transform/test_acc.json \
	results/tune/metrics.json results/prune/metrics.json results/transform/metrics.json results/analysis/metrics.json \
	dvc.lock

.PHONY: install lock repro baseline test test-fast lint format describe ui gpu-wheels

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r $(LOCK)
	$(BIN)/python -m pip install -q --no-deps -e .
	@$(BIN)/python -m pip check >/dev/null || { $(BIN)/python -m pip check; \
		echo "$(LOCK) does not satisfy pyproject.toml: run 'make lock' and commit $(LOCK)"; exit 1; }
	@touch $(STAMP)

install: $(STAMP)  ## create .venv and install the project with the locked versions (requirements.lock)

lock:  ## re-resolve pyproject.toml's dependencies (dev extra included) into requirements.lock, in a fresh venv
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q -e '.[dev]'
	{ echo "# Every package 'make install' installs, at the version it installs (pip freeze of a fresh venv of"; \
	  echo "# pyproject.toml with its dev extra, Python $$($(LOCK_VENV)/bin/python -c 'import platform; print(platform.python_version())')). Regenerate with 'make lock'; never edit by hand."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable; } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf $(LOCK_VENV)

repro: $(STAMP)  ## run the whole pipeline on the embedded default (dvc repro)
	PATH="$(CURDIR)/$(BIN):$$PATH" dvc repro

baseline: repro  ## refresh the committed reference (metrics, dvc.lock) from this run on a fresh clone, then `git commit` it
	git add $(BASELINE)
	@git diff --cached --stat -- $(BASELINE)
	@echo "staged the reference (metrics files, dvc.lock): commit them (git commit -m 'baseline: <what changed>')"

# Two pytest-xdist workers: the tests that share real tools stay together in one worker (tests/conftest.py): the
# integration tests in two groups (each with its own local Ray, MLflow server and project copy), the two-node cluster
# in one; the other tests fill in around them (TEST_WORKERS=0: one process, as `.venv/bin/pytest` alone runs them).
TEST_WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))

test: $(STAMP)  ## the full test suite, integration tests included (TEST_WORKERS=2 processes)
	$(BIN)/pytest $(PYTEST_PARALLEL)

test-fast: $(STAMP)  ## unit tests only
	$(BIN)/pytest $(PYTEST_PARALLEL) -m "not slow and not browser"

lint: $(STAMP)  ## ruff's checks, and that every file is as ruff format writes it (CI runs this before the tests)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)  ## rewrite the files as ruff format writes them
	$(BIN)/ruff format .

describe: $(STAMP)  ## parameter / FLOP table of the paper's models
	$(BIN)/python -m stages.describe

ui: $(STAMP)  ## MLflow UI on the project's store at http://127.0.0.1:$(PORT) (local only; PORT=5000), on the sweep's trials
	@$(BIN)/python -m stages.ui --port $(PORT)
	@echo "(Ctrl-C stops the server)"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow server --backend-store-uri sqlite:///$(CURDIR)/mlflow.db \
		--host 127.0.0.1 --port $(PORT) --workers 1

# A lent GPU machine has its own Python 3.12 and torch but no pydantic: `benchmarks/gpu_evidence.sh` installs these
# wheels there (benchmarks/gpu_machine.py lists them; the versions are requirements.lock's). .whl/ is git-ignored.
gpu-wheels: $(STAMP)  ## download the wheels the GPU evidence carries to a lent GPU machine into .whl/
	rm -rf .whl && mkdir -p .whl
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $$($(BIN)/python -m benchmarks.gpu_machine)
	@ls .whl
