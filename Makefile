# One entry point for what CI runs. `make up` starts the local stack; `make check` runs every check.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Processes for the pure tier: CI's machine has two cores.
WORKERS ?= 2

# The pure tier starts no broker and times no process of its own: unit tests, replay histories,
# compose files. It runs in WORKERS processes (pytest-xdist, test by test: the Avro codec's
# property file alone holds a large share of its time) and measures the core's coverage. Every
# other test starts brokers, nodes or browsers and waits on them with deadlines: it runs one test
# at a time, with no coverage tracing (the judges fold whole logs through the core in-process).
PURE_TESTS := tests/unit tests/replay tests/test_compose.py tests/test_compose_cluster.py
# On Kafka 4 (docs/operations.md, "Kafka versions"): the single-process broker tiers (every Kafka
# adapter's contract, the broker, topic provisioning) and the multi-process scenarios that lean
# most on the broker: transactions and fencing of nodes, group take-over, the changelog,
# workers' consumer groups, dispatch partitions grown live, SASL_SSL with ACLs.
KAFKA4_TESTS := tests/contract tests/integration/test_broker.py tests/integration/test_topics.py \
  tests/integration/test_engine_nodes.py tests/integration/test_engine_takeover.py \
  tests/integration/test_changelog.py tests/integration/test_engine_workers.py \
  tests/integration/test_dispatch_partitions.py tests/integration/test_secure_kafka.py

.PHONY: install up kafka down check lint test test-pure test-process test-kafka4 browser bench clean

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

test: test-pure test-process

test-pure: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) --durations=25 \
	  --cov --cov-report=term-missing:skip-covered --cov-fail-under=100 $(PURE_TESTS)

test-process: $(STAMP)
	$(BIN)/python -m pytest --durations=25 $(addprefix --ignore=,$(PURE_TESTS))

# A broker of its own on Kafka 4, whatever EVSCHED_KAFKA_BOOTSTRAP names (the conftest's local
# broker follows EVSCHED_KAFKA_VERSION; test_secure_kafka's SASL_SSL broker does too).
test-kafka4: $(STAMP)
	env -u EVSCHED_KAFKA_BOOTSTRAP EVSCHED_KAFKA_VERSION=$$($(BIN)/python -c \
	  'from evsched.devstack.toolchain import KAFKA4_VERSION as v; print(v)') \
	  $(BIN)/python -m pytest -m broker --durations=15 $(KAFKA4_TESTS)

# The dashboard in headless Chromium (apt-get install chromium); also part of `make test`.
browser: $(STAMP)
	$(BIN)/python -m pytest tests/browser -m browser

check: lint test test-kafka4

clean:
	rm -rf $(VENV) .coverage .coverage.* .mypy_cache .ruff_cache .pytest_cache
