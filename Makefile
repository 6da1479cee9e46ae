# Two commands do all set-up: `make demo` and `make test` each bootstrap .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-chaos test-cluster lint bench venv tools java kafka clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# gbstats is the tests' oracle for the confidence sequence; it pins numpy<2 and pandas<2 for
	# parts the tests never import, so it goes in without its dependencies.
	$(BIN)/python -m pip install --quiet --no-deps 'gbstats==0.8.0'
	touch $(STAMP)

venv: $(STAMP)

# promtool and the Prometheus server come from Debian's `prometheus` package; tmux drives the
# terminal test of `evald top`. apt-get reads </dev/null: run in the background of a terminal
# (e.g. under `timeout`), it would otherwise get SIGTTOU restoring the terminal and stop for good.
tools:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's prometheus package (promtool + server)"; \
	    apt-get update -qq </dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus </dev/null >/dev/null; \
	  else echo "promtool not found: install Debian's 'prometheus' package" >&2; exit 1; fi; }
	@command -v tmux >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's tmux (the evald top terminal test)"; \
	    apt-get update -qq </dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tmux </dev/null >/dev/null; \
	  else echo "tmux not found: install Debian's 'tmux' package" >&2; exit 1; fi; }

# The Kafka integration tests and `make kafka` run Apache Kafka from Maven Central on a JVM
# (deploy/local_kafka): Debian's openjdk-17-jdk-headless and maven.
java:
	@{ command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's openjdk-17-jdk-headless and maven"; \
	    apt-get update -qq </dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jdk-headless maven </dev/null >/dev/null; \
	  else echo "java or mvn not found: install Debian's 'openjdk-17-jdk-headless' and 'maven' (Java >= 17)" >&2; exit 1; fi; }

# A local Apache Kafka on 127.0.0.1:9092 in the foreground (Ctrl-C stops it); ARGS=--fresh wipes its data.
kafka: $(STAMP) java
	$(BIN)/python -m deploy.local_kafka start $(ARGS)

# `make demo` gets its own venv with evald's runtime dependencies only (no test or dev tools).
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

$(DEMO_STAMP): pyproject.toml
	test -x $(DEMO_VENV)/bin/python || $(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install --quiet -e .
	touch $(DEMO_STAMP)

# ARGS passes flags through, e.g. `make demo ARGS="--metrics-address 127.0.0.1:0"`.
demo: $(DEMO_STAMP)
	$(strip $(DEMO_VENV)/bin/evald demo $(ARGS))

# Two workers (pytest-xdist), each with its own test broker: the Kafka tests mostly wait.
test: $(STAMP) tools java
	$(BIN)/ruff check evald tests benchmarks deploy
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=25

# The chaos tier: kill -9 at each step of the commit cycle (restart and takeover), twenty seeded
# random kills, scale 1 -> 3 -> 1, the broker killed and restarted on its data, the broker paused
# past the request timeout or cut past the session timeout, a broker restarted empty, the
# repartition stage killed at each step of its cycle, the repartition stage and the main stage
# killed at random together, kills around the commits of
# comparison shares, the repartition stage through an outage, a test broker whose port was taken,
# rolling SIGTERM and kill -9 restarts of two instances during replays, six seeded kills of
# `evald run --mapping ubi` while lists assemble, the zero-feedback signals and the click model
# through a kill -9, kills around the first interleaving credit share, faults while restoring and
# rolling restarts of two instances with every feature on and with UBI (41 tests; measured
# figures in docs/performance.md).
test-chaos: $(STAMP) java
	$(BIN)/python -m pytest -q -m chaos

# The long tier: tests that need no fault but take 20-40 s each, too long for `make test` to stay
# well under 15 minutes on two cores: the negative controls of the generated promtool scenarios
# and the compose stack's alert timeline the README states (4 tests, about 2 minutes).
test-long: $(STAMP) tools
	$(BIN)/python -m pytest -q -m long

# The three-broker tier: evald on three Apache Kafka nodes (RF 3, min ISR 2) while the leader of
# a results partition, the transaction coordinator, the group coordinator or two brokers die,
# and through a rolling restart (6 tests, 7.5 minutes on a quiet two-core machine; not in `make test` for its wall time).
test-cluster: $(STAMP) java
	$(BIN)/python -m pytest -q -s -m cluster tests/daemon/test_kafka_cluster.py

lint: $(STAMP)
	$(BIN)/ruff check evald tests benchmarks deploy
	$(BIN)/ruff format --check evald tests benchmarks deploy
	$(BIN)/python -m mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks $(ARGS)

clean:
	rm -rf $(VENV) $(DEMO_VENV) .pytest_cache .ruff_cache .hypothesis
