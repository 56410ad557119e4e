# One-command set-up: every target creates .venv/ (if missing) and installs the project into it, once.
# A second call reinstalls nothing unless pyproject.toml changed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install repro test test-fast lint describe ui clean-results

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)  ## create .venv and install the project with its pinned dependencies

repro: $(STAMP)  ## run the whole pipeline on the embedded default (dvc repro)
	PATH="$(CURDIR)/$(BIN):$$PATH" dvc repro

test: $(STAMP)  ## the full test suite, integration tests included
	$(BIN)/pytest

test-fast: $(STAMP)  ## unit tests only
	$(BIN)/pytest -m "not slow and not browser"

lint: $(STAMP)
	$(BIN)/ruff check .

describe: $(STAMP)  ## parameter / FLOP table of the paper's models
	$(BIN)/python -m stages.describe

ui: $(STAMP)  ## MLflow UI on the project's store at http://127.0.0.1:5000 (local only), on the sweep's runs table
	@$(BIN)/python -c "from pipeline.config import load_params; from mlflow.tracking import MlflowClient; \
		e = MlflowClient('sqlite:///$(CURDIR)/mlflow.db').get_experiment_by_name(load_params('params.yaml').tracking.experiment); \
		page = f'experiments/{e.experiment_id}/runs' if e else 'experiments?workflowType=machine_learning'; \
		print(f'MLflow UI: http://127.0.0.1:5000/#/{page} (Ctrl-C stops it)')"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow server --backend-store-uri sqlite:///$(CURDIR)/mlflow.db \
		--host 127.0.0.1 --port 5000 --workers 1
