# Both entry points build or refresh .venv first, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# The suite waits on brokers, Spark and child processes for long stretches, so it runs
# more workers than two cores: with 4, the two cores sat a third idle for minutes at a
# time and the same code took 9 min 43 s; with 6, 8 min 50 s.
TEST_WORKERS ?= 6

.PHONY: run test lint unit slow bench report report-check clean java rsyslog postgres

# The compiled core (src/eventspool/_core) is built by the package's own install.
CORE_SOURCES := setup.py $(wildcard src/eventspool/_core/*.pyx src/eventspool/_core/*.pxi src/eventspool/_core/*.h)

$(STAMP): pyproject.toml $(CORE_SOURCES)
	@command -v $${CC:-cc} >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || { \
		echo "eventspool compiles its core with a C compiler and none was found: install one (apt-get install gcc)" >&2; exit 1; }
	@$(PYTHON) -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' || { \
		echo "eventspool compiles its core against the Python headers and $(PYTHON) has none: install them (apt-get install python3-dev)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Spark needs a Java runtime: install one where the machine has none (Debian, as root).
java:
	@command -v java >/dev/null 2>&1 || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		openjdk-17-jre-headless; }

# The Spark pipeline's tables (the main job, the Spark tests): a throwaway PostgreSQL server
# needs the server's binaries, initdb and postgres.
postgres:
	@{ command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || \
	{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends postgresql; }

# The log-shipper anchor of the benchmarks (and its tests): rsyslog with omkafka.
rsyslog:
	@{ command -v rsyslogd >/dev/null 2>&1 && \
		ls /usr/lib/*/rsyslog/omkafka.so /usr/lib/rsyslog/omkafka.so 2>/dev/null | grep -q .; } || \
	{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends rsyslog rsyslog-kafka; }

run: $(STAMP) java postgres
	$(BIN)/python -m eventspool.demo

test: $(STAMP) java rsyslog postgres lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/python -m mypy.stubtest --allowlist src/eventspool/_core/stubtest_allowlist.txt \
		eventspool._core.native
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

slow: $(STAMP) java rsyslog postgres
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m slow $(PYTEST_ARGS)

# bench/report.py runs the benches itself, so it is not one of them.
BENCH_SCRIPTS := $(filter-out bench/report.py,$(wildcard bench/[!_]*.py))
REPORT_ARGS ?=

bench: $(STAMP) java rsyslog
	for script in $(BENCH_SCRIPTS); do $(BIN)/python $$script --quick || exit 1; done

# docs/benchmarks.md, its plots and data: every bench in full, then a 30-minute soak.
report: $(STAMP) java rsyslog
	$(BIN)/python bench/report.py $(REPORT_ARGS)

# Rerun every bench as the published report was run and compare the ratios.
report-check: $(STAMP) java rsyslog
	$(BIN)/python bench/report.py --check $(REPORT_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
	rm -f src/eventspool/_core/*.c src/eventspool/_core/*.so
