# The two commands of the README: `make demo` and `make test`. Both set everything up themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.outboxkit-installed
# Five workers, each with its own PostgreSQL and Kafka: the suite mostly waits on services.
# On 2 cores, clean clones of the same code, 2026-12-07: 899 s with five against 1043 s with four;
# six took 862 s but kept the CPU 96 % busy (median) and its tests ran 9 % longer each, so
# timing-sensitive ones would have less margin (earlier, 2026-12-06: 737 s with four, 875 s
# with three, 1131 s with two, on a smaller suite).
PYTEST_WORKERS ?= -n 5 --dist loadfile

.PHONY: demo test lint typecheck check bench bench-debezium clean system-deps

$(STAMP): pyproject.toml
	@bash scripts/ensure-system-deps.sh
	test -x $(PY) || python3 -m venv $(VENV)
	@# A venv cut short while it was made (Ctrl-C during ensurepip) has a python but no pip:
	@# pip is put in, or every later run would stop at "No module named pip".
	$(PY) -m pip --version >/dev/null 2>&1 || $(PY) -m ensurepip --upgrade
	$(PY) -m pip install -q --upgrade "pip>=25.1"
	$(PY) -m pip install -q -e . --group dev
	touch $(STAMP)

system-deps:
	bash scripts/ensure-system-deps.sh

## demo: writers, two relays (the active one SIGKILLed, the standby takes over), a consumer killed
## after its DB commit; live progress, then a verification table. Self-started PostgreSQL + Kafka.
demo: $(STAMP)
	$(VENV)/bin/outboxkit demo

## test: the whole test suite against a self-started PostgreSQL + Kafka
test: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict outboxkit examples

check: lint typecheck

bench: $(STAMP)
	$(PY) benchmarks/writes.py
	$(PY) benchmarks/relay.py
	$(PY) benchmarks/consumer.py

## bench-debezium: outboxkit's relay and Debezium's outbox router on the same PostgreSQL, Kafka and
## rows (fetches Kafka Connect + Debezium from Maven Central once); writes benchmarks/results/
bench-debezium: $(STAMP)
	$(PY) -m benchmarks.debezium

clean:
	rm -rf $(VENV) build dist *.egg-info
