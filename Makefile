# kafka-diode: `make demo` and `make test` are the two set-up commands (README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install jars tools check fmt docs test test-all chaos demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Resolves the Kafka broker and Spark connector jars from Maven Central once, into the user cache.
jars: $(STAMP)
	$(BIN)/kafka-diode local-kafka fetch

# promtool and prometheus (Debian's `prometheus` package) for the alert-rule tests; installed only
# when missing and we are root (CI is), otherwise a hint (those tests then skip outside CI).
tools:
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; \
	else echo "note: install Debian's 'prometheus' package for the alert-rule tests (promtool)"; fi
	@# ISA-L (libisal2): the sender's FEC repairs by SIMD (common/wire/reed_solomon.py), optional
	@if ldconfig -p 2>/dev/null | grep -q 'libisal\.so\.2'; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libisal2; \
	else echo "note: install Debian's 'libisal2' package: FEC repairs 10x faster (optional)"; fi

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Regenerates docs/configuration.md from the config dataclasses (a test checks it is current).
docs: $(STAMP)
	$(BIN)/python -m kafka_diode.docs_gen > docs/configuration.md

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Everything CI runs: static checks, unit, property, integration and the fast chaos subset.
test: check jars tools
	$(BIN)/pytest -m "not slow" --durations=30 $(PYTEST_ARGS)

# The full matrix, including the slow chaos scenarios.
test-all: check jars tools
	$(BIN)/pytest $(PYTEST_ARGS)

chaos: jars
	$(BIN)/pytest -m chaos $(PYTEST_ARGS)

demo: jars
	$(BIN)/kafka-diode demo

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
