# The two commands of the README's Quick start, and what they need.
#   make demo   end-to-end demo on a local embedded setup
#   make test   lint (ruff, the import-layer contract) and the whole test suite
#   make soak-tests  the tests marked soak (each over ~40 s; the default suite leaves them out)
#   make crash  1000 randomized writer/maintenance SIGKILL trials (bench/crash.py; TRIALS=N to change)
# Both create .venv/ and install memwal with its pinned dependencies, then fetch the JVM
# artifacts with Maven into .jars/ (Spark's Kafka connector, an Apache Kafka 4 broker,
# hadoop-aws: memwal/jvm/*.pom.xml); both install Java and Maven via apt when missing.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

JARS := .jars/.complete

.PHONY: demo test soak-tests crash system-deps clean

system-deps:
	@command -v java >/dev/null 2>&1 || { echo "installing Java (for Spark)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless; }
	@command -v mvn >/dev/null 2>&1 || { echo "installing Maven (fetches the JVM artifacts)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends maven; }

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# compat: the checkout on the Python path, so Spark's data source lookup finds pyspark_memwal
	$(PY) -m pip install -q -e ".[dev]" --config-settings editable_mode=compat
	touch $@

# Each group is fetched again only when its pom or the pinned versions change (memwal/jvm).
$(JARS): $(VENV)/.installed memwal/jvm/__init__.py $(wildcard memwal/jvm/*.pom.xml)
	$(PY) -m memwal.jvm fetch
	touch $@

demo: system-deps $(VENV)/.installed $(JARS)
	$(PY) -m memwal.demo

test: system-deps $(VENV)/.installed $(JARS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest

soak-tests: system-deps $(VENV)/.installed $(JARS)
	$(PY) -m pytest -m soak

TRIALS ?= 1000
crash: $(VENV)/.installed $(JARS)
	$(PY) bench/crash.py --trials $(TRIALS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .jars
