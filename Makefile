# One entry point for what CI runs. `make up` starts the local stack; `make check` runs every check.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install up kafka down check lint test browser bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,lint]'
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(BIN)/evsched dev

kafka: $(STAMP)
	$(BIN)/evsched kafka up

down: $(STAMP)
	$(BIN)/evsched kafka down

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP)
	$(BIN)/coverage run -m pytest --durations=25
	$(BIN)/coverage report --include='src/evsched/core/*' --fail-under=100

# The dashboard in headless Chromium (apt-get install chromium); also part of `make test`.
browser: $(STAMP)
	$(BIN)/python -m pytest tests/browser -m browser

check: lint test

clean:
	rm -rf $(VENV) .coverage .mypy_cache .ruff_cache .pytest_cache
