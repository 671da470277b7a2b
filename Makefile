# The two commands of the README's Quick start, and what they need.
#   make demo   end-to-end demo on a local embedded setup
#   make test   lint (ruff, the import-layer contract) and the whole test suite
#   make crash  1000 randomized writer/maintenance SIGKILL trials (bench/crash.py; TRIALS=N to change)
# Both create .venv/ and install memwal with its pinned dependencies; both install Java
# (Spark needs it) and Node.js/npm (the Apache Kafka test broker comes from npm) via apt
# when missing.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test crash system-deps clean

system-deps:
	@command -v java >/dev/null 2>&1 || { echo "installing Java (for Spark)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless; }
	@command -v npm >/dev/null 2>&1 || { echo "installing npm (for the Kafka test broker)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends nodejs npm; }

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

demo: system-deps $(VENV)/.installed
	$(PY) -m memwal.demo

test: system-deps $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest

TRIALS ?= 1000
crash: $(VENV)/.installed
	$(PY) bench/crash.py --trials $(TRIALS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
