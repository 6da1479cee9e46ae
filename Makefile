# Two commands do all set-up: `make demo` and `make test` each bootstrap .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench venv tools java kafka clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# promtool and the Prometheus server come from Debian's `prometheus` package.
tools:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's prometheus package (promtool + server)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "promtool not found: install Debian's 'prometheus' package" >&2; exit 1; fi; }

# The Kafka integration tests and `make kafka` run Apache Kafka from Maven Central on a JVM
# (deploy/local_kafka): Debian's openjdk-17-jdk-headless and maven.
java:
	@{ command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's openjdk-17-jdk-headless and maven"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jdk-headless maven >/dev/null; \
	  else echo "java or mvn not found: install Debian's 'openjdk-17-jdk-headless' and 'maven' (Java >= 17)" >&2; exit 1; fi; }

# A local Apache Kafka on 127.0.0.1:9092 in the foreground (Ctrl-C stops it); ARGS=--fresh wipes its data.
kafka: $(STAMP) java
	$(BIN)/python -m deploy.local_kafka start $(ARGS)

demo: $(STAMP)
	$(BIN)/evald demo

test: $(STAMP) tools java
	$(BIN)/ruff check evald tests benchmarks deploy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check evald tests benchmarks deploy
	$(BIN)/ruff format --check evald tests benchmarks deploy

bench: $(STAMP)
	$(BIN)/python -m benchmarks $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
