# Two commands a newcomer needs: `make dev` and `make test`.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install dev test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[worker,embedded,test]'
	touch $@

# Starts PostgreSQL and Redis (embedded unless DATABASE_URL / REDIS_URL are set),
# migrates, and runs web + tasks + clock with a demo project.
dev: install
	$(BIN)/python -m app.devstack

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/claim_throughput.py
	$(BIN)/python bench/claim_latency.py
	$(BIN)/python bench/enqueue_throughput.py

clean:
	rm -rf $(VENV) var .pytest_cache
