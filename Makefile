# The two commands of the README's Quick start, and what they need.
#   make demo   end-to-end demo on a local embedded setup
#   make test   lint (ruff, the import-layer contract) and the whole test suite
#   make test-full   make test with every property test's full example count and the whole fault matrix
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

.PHONY: demo test test-full soak-tests crash system-deps clean

system-deps:
	@command -v java >/dev/null 2>&1 || { echo "installing Java (for Spark)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless; }
	@command -v mvn >/dev/null 2>&1 || { echo "installing Maven (fetches the JVM artifacts)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends maven; }

$(VENV)/.installed: pyproject.toml tools/dev_install.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The pinned dependencies, and this checkout on the environment's path (so Spark's data
	# source lookup finds pyspark_memwal; tools/dev_install.py says why not an editable install)
	$(PY) tools/dev_install.py $(VENV) dev
	touch $@

# Each group is fetched (or built) again only when its pom, sources or the pinned versions change (memwal/jvm).
$(JARS): $(VENV)/.installed memwal/jvm/__init__.py $(wildcard memwal/jvm/*.pom.xml) $(wildcard memwal/jvm/realtime/*.java)
	$(PY) -m memwal.jvm fetch
	touch $@

demo: system-deps $(VENV)/.installed $(JARS)
	$(PY) -m memwal_dev.demo

test: system-deps $(VENV)/.installed $(JARS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest --junitxml=.test-results/junit.xml

# What make test leaves out for time, with the same gate otherwise: every property test at its full
# example count and the whole fault matrix of docs/faults.md (MEMWAL_TEST_PROFILE=full, see
# tests/helpers.py). Run it before a release and after changes to the write path, the readers or
# the storage layer; it takes about 5 minutes more than make test.
test-full: system-deps $(VENV)/.installed $(JARS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	MEMWAL_TEST_PROFILE=full $(PY) -m pytest --junitxml=.test-results/junit-full.xml

soak-tests: system-deps $(VENV)/.installed $(JARS)
	$(PY) -m pytest -m soak

TRIALS ?= 1000
crash: $(VENV)/.installed $(JARS)
	$(PY) bench/crash.py --trials $(TRIALS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .jars .test-results
