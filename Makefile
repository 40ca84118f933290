# Two entry points for a fresh machine: `make demo` and `make test`. Both bootstrap uv if it is missing.
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
PYTHON ?= python3
UV := $(PYTHON) -m uv
# Two test workers (each starts its own throwaway servers; idle workers steal queued tests): the CI machine has 2 cores.
# The slowest tests are listed at the end, to keep the whole run under its 15 minutes.
PYTEST_ARGS ?= -n 2 --dist worksteal --durations=25

.PHONY: uv postgres chromium demo test lint typecheck pytest bench screenshots

uv:
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet uv

# PostgreSQL binaries for the test session's throwaway cluster (tests/support/servers/postgres.py starts it).
# Debian's package would start its own cluster on 5432 unless told not to create one.
postgres:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		mkdir -p /etc/postgresql-common && \
		echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf && \
		apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql; \
	fi

# Debian's Chromium for the inspector's browser tests (tests/inspector/): Playwright drives /usr/bin/chromium
# (its own browser download is never used).
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
		apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; \
	fi

# --inexact: install what the demo needs and keep what is there (the extras `make test` installed).
demo: uv
	$(UV) sync --locked --inexact --quiet
	$(UV) run --locked --no-sync python -m step_persistence.demo $(ARGS)

lint: uv
	$(UV) run --locked ruff check src tests benchmarks
	$(UV) run --locked ruff format --check src tests benchmarks

typecheck: uv
	$(UV) run --locked mypy

pytest: uv
	$(UV) run --locked pytest $(PYTEST_ARGS)

test: uv postgres chromium
	$(UV) sync --locked --all-extras --quiet
	$(MAKE) --no-print-directory lint typecheck pytest

# docs/images/inspector-*.png: the inspector's main pages over a scripted store (shown in docs/inspector.md).
screenshots: uv chromium
	$(UV) sync --locked --all-extras --quiet
	$(UV) run --locked --no-sync python tests/support/inspector_screenshots.py docs/images

# Issue 8's benchmarks against pydantic-ai-harness, in their own environment (benchmarks/pyproject.toml:
# the comparator pins its pydantic-ai version). Starts its own PostgreSQL and SecantusDB, writes
# benchmarks/RESULTS.md. BENCH_ARGS passes options (see `python benchmarks/bench.py --help`).
# Then issue 21's durable-run benchmark next to DBOS, on SQLite, in its own environment too
# (benchmarks/durable/pyproject.toml: pydantic-ai 2.68 with the dbos extra); DURABLE_BENCH_ARGS passes its options.
bench: uv postgres
	cd benchmarks && $(UV) sync --locked --quiet && $(UV) run --locked python bench.py $(BENCH_ARGS)
	cd benchmarks/durable && $(UV) sync --locked --quiet && $(UV) run --locked python durable_bench.py $(DURABLE_BENCH_ARGS)
