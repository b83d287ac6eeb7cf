# Developer entry points. `make test` is what CI runs (through .ci/run).
# `make soak` is the chaos soak on one redis-server; `make soak-cluster` the same soak on a local
# Redis Cluster (3 masters + 3 replicas) whose masters are SIGKILLed and failed over.
SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON      ?= python3
VENV        := .venv
VPY         := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PYTEST_ARGS ?=

# The Redis that `make run` starts when REDIS_URL is unset (append-only with `appendfsync
# always`: an acknowledged decision survives a crash of the machine; kept in ./var/redis).
RUN_REDIS_PORT := 6380
RUN_REDIS_DIR  := $(CURDIR)/var/redis
RUN_REDIS_PID  := $(RUN_REDIS_DIR)/redis-server.pid
RUN_REDIS_URL  := redis://127.0.0.1:$(RUN_REDIS_PORT)/0
# Exit 0 when a Redis answers PING on the run port (redis-cli may be absent: use redis-py).
RUN_REDIS_PING := $(VPY) -c "import redis,sys; sys.exit(0 if redis.Redis(host='127.0.0.1', port=$(RUN_REDIS_PORT), socket_connect_timeout=0.5).ping() else 1)" >/dev/null 2>&1

.PHONY: install .venv redis-check chromium-check test docs run stop-redis migrate-layout lint format bench soak soak-cluster clean distclean

# ------------------------------------------------------------------------ environment
$(VPY):
	@echo "make: creating the virtualenv $(VENV)"
	$(PYTHON) -m venv $(VENV)

# Reinstall only when pyproject.toml changed (or a package's __init__.py appeared: the
# editable install maps the packages that existed when it ran).
PACKAGE_INITS := $(wildcard agent_core/__init__.py agent_audit/__init__.py agent_mcp/__init__.py bot/__init__.py playground/__init__.py)
$(STAMP): pyproject.toml $(PACKAGE_INITS) | $(VPY)
	@echo "make: installing the gateway with the development tools (pytest, mypy, ruff, playwright, build, mkdocs) into $(VENV); a first install takes a few minutes"
	$(VPY) -m pip install -q -e '.[dev]'
	@touch $@

# What `make run` needs: the gateway and its runtime dependencies only (a development
# install, when there is an up-to-date one, has them too).
RUN_STAMP := $(VENV)/.installed-run
$(RUN_STAMP): pyproject.toml $(PACKAGE_INITS) | $(VPY)
	@if [ -f "$(STAMP)" ] && [ "$(STAMP)" -nt pyproject.toml ]; then \
	  echo "make run: using the development install in $(VENV)"; \
	else \
	  echo "make run: installing the gateway and what it needs to run into $(VENV) (a first install takes a minute or two)"; \
	  $(VPY) -m pip install -q -e . || exit 1; \
	fi
	@touch $@

install: $(STAMP)
.venv: install

# redis-server must be on PATH: tests start their own, `make run` may start one.
redis-check:
	@if ! command -v redis-server >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    echo "redis-server not found: installing Debian's redis-server"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } || exit 1; \
	    command -v redis-server >/dev/null 2>&1 || { echo "redis-server still not on PATH after apt-get install" >&2; exit 1; }; \
	  else \
	    echo "redis-server is not installed: run \`sudo apt-get install redis-server\` (Debian/Ubuntu) or \`brew install redis\`" >&2; \
	    exit 1; \
	  fi; \
	fi

# The playground's browser tests drive Debian's Chromium (never a browser Playwright downloads).
CHROMIUM ?= /usr/bin/chromium
chromium-check:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    echo "$(CHROMIUM) not found: installing Debian's chromium"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || exit 1; \
	    [ -x "$(CHROMIUM)" ] || { echo "$(CHROMIUM) still missing after apt-get install chromium" >&2; exit 1; }; \
	  else \
	    echo "Chromium is not installed: run \`sudo apt-get install chromium\` (Debian/Ubuntu), or set CHROMIUM=/path/to/chromium" >&2; \
	    exit 1; \
	  fi; \
	fi

# ------------------------------------------------------------------------ test & lint
# Tests start a private redis-server on a free port, or use TEST_REDIS_URL when set. The
# documentation site is built first (a few seconds): a broken link or docstring fails the test.
# TEST_WORKERS pytest-xdist processes (each with its own servers) share the test files: most
# tests wait on processes and sockets, so two halve the time on two cores. A file's tests stay
# in one process (its module fixtures, such as the wheel's build, are made once). Files are
# handed out in collection order (--no-loadscope-reorder: xdist would put the files with the
# most tests first, and so the few long ones last), and tests/conftest.py puts the longest
# files first. One process with TEST_REDIS_URL: every test flushes that one database.
TEST_WORKERS ?= $(if $(TEST_REDIS_URL),0,2)
test: install redis-check chromium-check docs
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --ignore=tests/bench --ignore=tests/soak $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/) into ./site, with --strict: a warning (a broken
# link or anchor, a docstring mkdocstrings cannot read) fails it. The configuration reference
# is generated by docs/hooks/settings_reference.py from the settings' own descriptions.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict --quiet --site-dir site

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Benchmarks (tests/bench, not part of `make test`): installs the `bench` extra (the peer
# frameworks, py-spy), prints the tables and writes tests/bench/RESULTS.md and SLACK_RESULTS.md.
# About 17 minutes: 6 to 7 for tests.bench (its throughput part runs on one redis-server and
# on a local Redis Cluster) and 8 to 10 for tests.bench.slack_latency (plus the first install
# of the extra).
# BENCH_ARGS="--quick" for a smoke run, "--only pause" (or throughput, memory) for one part,
# "--no-cluster" to skip the cluster.
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_ARGS  ?=
SLACK_BENCH_ARGS ?=
$(BENCH_STAMP): pyproject.toml | $(STAMP)
	$(VPY) -m pip install -q -e '.[dev,bench]'
	@touch $@

bench: install redis-check $(BENCH_STAMP)
	$(VPY) -m tests.bench $(BENCH_ARGS)
	$(VPY) -m tests.bench.slack_latency $(SLACK_BENCH_ARGS)
	$(VPY) -m tests.bench.decision_wait

# The soak (tests/soak/test_soak.py): runs under random decisions (approve, deny, expire,
# double clicks, approver races, cancels, late clicks; and for its routed, reminded, escalated
# and two-approver tools: outsiders' clicks, the escalated person, quorum races, the bot removed
# from the approval channel and invited back; Edit & approve, invalid edits, Approve & allow
# and /agent grants revokes, checking the audit trail at the end) while web and workers are SIGKILLed,
# workers are paused (SIGSTOP) past their lease and continued, and Redis is restarted from its
# AOF. Prints runs, decisions, SIGKILLs, pauses, takeovers, Redis restarts, in-doubt calls and
# violations. SOAK_SECONDS=600 by default (11-20 min with the drain); SOAK_SEED=N replays a
# seed's choices; SOAK_STRICT=1 also fails on known issues. The processes' logs and the tools'
# journal of the last soak stay in $(SOAK_BASETEMP) (emptied when the next soak starts).
SOAK_SECONDS  ?= 600
SOAK_BASETEMP ?= $(CURDIR)/var/soak
soak: install redis-check
	@mkdir -p "$(dir $(SOAK_BASETEMP))"
	SOAK_SECONDS=$(SOAK_SECONDS) $(VPY) -m pytest -q -s -p no:cacheprovider \
	  --basetemp=$(SOAK_BASETEMP) tests/soak/test_soak.py $(PYTEST_ARGS)

# The same soak and verdict on a local Redis Cluster (3 masters + 3 replicas on loopback, as in
# tests/cluster/), web and workers given only a node's URL and DECISION_REPLICAS=1; instead of
# the Redis restarts, a master is SIGKILLed a few times (its replica is promoted, then the killed
# node rejoins as a replica; every other kill right after an acknowledged Approve, checking that
# each decision shows its effect within 15 s). Prints master failovers where `soak` prints
# Redis restarts, and the failover bound's line (clicks measured, max, p50). Same
# knobs (11-15 min by default); its logs (and the nodes' logs and files, in cluster/) stay in
# $(SOAK_CLUSTER_BASETEMP).
SOAK_CLUSTER_BASETEMP ?= $(CURDIR)/var/soak-cluster
soak-cluster: install redis-check
	@mkdir -p "$(dir $(SOAK_CLUSTER_BASETEMP))"
	SOAK_CLUSTER=1 SOAK_SECONDS=$(SOAK_SECONDS) $(VPY) -m pytest -q -s -p no:cacheprovider \
	  --basetemp=$(SOAK_CLUSTER_BASETEMP) tests/soak/test_soak.py $(PYTEST_ARGS)

# ------------------------------------------------------------------------ run
# Starts web + worker with honcho (which sets PORT for each process from its base port, 5000
# unless told: -p keeps web on PORT, default 3000). Without REDIS_URL, starts (or reuses) a local append-only
# redis-server on 127.0.0.1:$(RUN_REDIS_PORT); `make stop-redis` stops it. Without
# SLACK_BOT_TOKEN, starts the local Slack playground instead (python -m playground: a fake
# Slack in the browser, which starts web + worker pointed at itself).
run: redis-check $(RUN_STAMP)
	@set -e; \
	if [ -z "$${REDIS_URL:-}" ]; then \
	  mkdir -p "$(RUN_REDIS_DIR)"; \
	  if $(RUN_REDIS_PING); then \
	    echo "make run: reusing the redis-server answering on 127.0.0.1:$(RUN_REDIS_PORT)"; \
	  else \
	    echo "make run: starting redis-server on 127.0.0.1:$(RUN_REDIS_PORT) (data in $(RUN_REDIS_DIR))"; \
	    redis-server --port $(RUN_REDIS_PORT) --bind 127.0.0.1 \
	      --appendonly yes --appendfsync always --dir "$(RUN_REDIS_DIR)" \
	      --logfile "$(RUN_REDIS_DIR)/redis-server.log" \
	      --daemonize yes --pidfile "$(RUN_REDIS_PID)"; \
	    for _ in $$(seq 50); do $(RUN_REDIS_PING) && break; sleep 0.1; done; \
	    $(RUN_REDIS_PING) || { echo "redis-server did not start; see $(RUN_REDIS_DIR)/redis-server.log" >&2; exit 1; }; \
	    echo "make run: redis-server started (pid $$(cat "$(RUN_REDIS_PID)"); \`make stop-redis\` stops it)"; \
	  fi; \
	  export REDIS_URL="$(RUN_REDIS_URL)"; \
	fi; \
	export PATH="$(CURDIR)/$(VENV)/bin:$$PATH"; \
	if [ -z "$${SLACK_BOT_TOKEN:-}" ]; then \
	  echo "make run: SLACK_BOT_TOKEN is not set: starting the local Slack playground (its URL comes last, once the bot and the worker are ready)"; \
	  exec $(VPY) -m playground; \
	fi; \
	if [ ! -x "$(VENV)/bin/honcho" ]; then \
	  echo "make run: installing honcho (runs web and worker from the Procfile) into $(VENV)"; \
	  $(VPY) -m pip install -q 'honcho>=2.0'; \
	fi; \
	echo "make run: starting web and worker (honcho start -f Procfile, web on PORT $${PORT:-3000})"; \
	exec $(VENV)/bin/honcho start -f Procfile -p "$${PORT:-3000}"

# Moves a deployment's keys from the old layout ({prefix:N} hash tags) to the new one: web and
# worker refuse to start until it has run. Stop every web and worker first. Reads REDIS_URL,
# KEY_PREFIX and SHARDS like them (REDIS_URL unset: the Redis of `make run`).
# MIGRATE_ARGS="--dry-run" only counts; "--force" goes on while workers are alive.
MIGRATE_ARGS ?=
migrate-layout: install
	REDIS_URL="$${REDIS_URL:-$(RUN_REDIS_URL)}" $(VPY) -m agent_core.migrate_layout $(MIGRATE_ARGS)

# Stops only the redis-server that `make run` started (found by its pidfile).
stop-redis:
	@if [ ! -f "$(RUN_REDIS_PID)" ]; then echo "no redis-server started by make run"; exit 0; fi; \
	pid=$$(cat "$(RUN_REDIS_PID)"); \
	if ! kill -0 "$$pid" 2>/dev/null || ! ps -p "$$pid" -o comm= | grep -q redis; then \
	  echo "stale pidfile (pid $$pid is not a running redis-server): removing it"; \
	  rm -f "$(RUN_REDIS_PID)"; exit 0; \
	fi; \
	kill -TERM "$$pid"; \
	for _ in $$(seq 100); do kill -0 "$$pid" 2>/dev/null || break; sleep 0.1; done; \
	if kill -0 "$$pid" 2>/dev/null; then echo "redis-server (pid $$pid) did not stop within 10 s" >&2; exit 1; fi; \
	rm -f "$(RUN_REDIS_PID)"; \
	echo "stopped redis-server (pid $$pid)"

# ------------------------------------------------------------------------ cleaning
clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist site *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

# Also removes the virtualenv and ./var (stop the make-run Redis first).
distclean: stop-redis clean
	rm -rf $(VENV) var
