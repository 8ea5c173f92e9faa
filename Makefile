# Two commands a newcomer needs: `make dev` and `make test`.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install system-packages translations translations-update dev test test-fast lint bench clean

install: $(VENV)/.installed

# Debian packages the browser, page and OCR work needs: Chromium (Playwright
# cannot download browsers here), a CJK font (the Chinese pages' screenshots)
# Tesseract 5 with the English, Polish and orientation (osd) packs,
# PgBouncer (the transaction-pooler tests) and nginx (the documented reverse
# proxy, run by tests/test_proxy_config.py). Only what is missing is installed; without root
# make stops at once with the one apt-get line to run as root.
SYSTEM_PACKAGES_MISSING = $(strip \
	$(if $(shell command -v chromium),,chromium) \
	$(if $(shell command -v tesseract),,tesseract-ocr) \
	$(if $(wildcard /usr/sbin/pgbouncer),,pgbouncer) \
	$(if $(wildcard /usr/sbin/nginx),,nginx-light) \
	$(if $(wildcard /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc),,fonts-wqy-zenhei) \
	$(foreach pack,eng osd pol,$(if $(wildcard /usr/share/tesseract-ocr/5/tessdata/$(pack).traineddata),,tesseract-ocr-$(pack))))

system-packages:
ifneq ($(SYSTEM_PACKAGES_MISSING),)
	@if [ "$$(id -u)" = 0 ]; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q $(SYSTEM_PACKAGES_MISSING) >/dev/null 2>&1 || \
		{ apt-get update -q && apt-get install -y -q $(SYSTEM_PACKAGES_MISSING); }; \
	else echo "missing system packages; as root run: apt-get install $(SYSTEM_PACKAGES_MISSING)" >&2; exit 1; fi
endif

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# setuptools explains editable installs with a UserWarning banner on every
	# install; it is information, not a problem, so it is not printed.
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/pip install -q -e '.[worker,embedded,test]'
	touch $@

# The page catalogs (app/translations/<lang>/LC_MESSAGES/messages.po) are
# compiled to .mo files, which are build output and not kept in git.
CATALOGS := $(wildcard app/translations/*/LC_MESSAGES/messages.po)
translations: install $(CATALOGS:.po=.mo)

app/translations/%/LC_MESSAGES/messages.mo: app/translations/%/LC_MESSAGES/messages.po
	$(BIN)/pybabel compile -d app/translations -l $* >/dev/null

# After changing page strings: extract them and merge them into each catalog,
# then translate what is new (tests/test_i18n.py fails until every string is).
translations-update: install
	$(BIN)/pybabel extract -F babel.cfg -k lazy_gettext -o app/translations/messages.pot . >/dev/null
	$(BIN)/pybabel update -i app/translations/messages.pot -d app/translations --no-fuzzy-matching

# Starts PostgreSQL and Redis (embedded unless DATABASE_URL / REDIS_URL are set),
# migrates, and runs web + tasks (with the clock) and consume with a demo project.
dev: install system-packages translations
	$(BIN)/python -m app.dev

# The code is checked first (ruff; the import contracts of pyproject.toml;
# mypy on the typed packages),
# then tested in TEST_PROCESSES processes (pytest-xdist; each with its own
# PostgreSQL and Redis databases, a test module kept in one process); the
# slowest tests are listed at the end: where the time goes.
TEST_PROCESSES ?= 2
test: install system-packages translations lint
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist loadfile --durations=25

# The first tier (tests/conftest.py): what needs nothing running, in about
# two minutes; make test runs every tier.
test-fast: install translations lint
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) -m unit

lint: install
	$(BIN)/ruff check app workers tasks tests bench migrations wsgi.py
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/claim_throughput.py
	$(BIN)/python bench/claim_latency.py
	$(BIN)/python bench/enqueue_throughput.py

clean:
	rm -rf $(VENV) var .pytest_cache
