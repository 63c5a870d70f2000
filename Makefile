# Both entry points build or refresh .venv first, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test lint unit slow bench report report-check clean java rsyslog

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Spark needs a Java runtime: install one where the machine has none (Debian, as root).
java:
	@command -v java >/dev/null 2>&1 || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		openjdk-17-jre-headless; }

# The log-shipper anchor of the benchmarks (and its tests): rsyslog with omkafka.
rsyslog:
	@{ command -v rsyslogd >/dev/null 2>&1 && \
		ls /usr/lib/*/rsyslog/omkafka.so /usr/lib/rsyslog/omkafka.so 2>/dev/null | grep -q .; } || \
	{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends rsyslog rsyslog-kafka; }

run: $(STAMP) java
	$(BIN)/python -m eventspool.demo

test: $(STAMP) java rsyslog lint
	$(BIN)/python -m pytest -n 2 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not slow" $(PYTEST_ARGS)

slow: $(STAMP) java rsyslog
	$(BIN)/python -m pytest -n 2 -m slow $(PYTEST_ARGS)

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
