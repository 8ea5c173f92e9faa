# Two commands a newcomer needs: `make dev` and `make test`.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install system-packages dev test bench clean

install: $(VENV)/.installed

# Debian packages the browser, page and OCR work needs: Chromium (Playwright
# cannot download browsers here) and Tesseract 5 with the English, Polish and
# orientation (osd) packs. Only what is missing is installed; without root
# the missing names are printed and the tests that need them fail.
SYSTEM_PACKAGES_MISSING = $(strip \
	$(if $(shell command -v chromium),,chromium) \
	$(if $(shell command -v tesseract),,tesseract-ocr) \
	$(foreach pack,eng osd pol,$(if $(wildcard /usr/share/tesseract-ocr/5/tessdata/$(pack).traineddata),,tesseract-ocr-$(pack))))

system-packages:
ifneq ($(SYSTEM_PACKAGES_MISSING),)
	@if [ "$$(id -u)" = 0 ]; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q $(SYSTEM_PACKAGES_MISSING) >/dev/null 2>&1 || \
		{ apt-get update -q && apt-get install -y -q $(SYSTEM_PACKAGES_MISSING); }; \
	else echo "missing system packages (install as root): $(SYSTEM_PACKAGES_MISSING)"; fi
endif

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[worker,embedded,test]'
	touch $@

# Starts PostgreSQL and Redis (embedded unless DATABASE_URL / REDIS_URL are set),
# migrates, and runs web + tasks + clock with a demo project.
dev: install system-packages
	$(BIN)/python -m app.devstack

test: install system-packages
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/claim_throughput.py
	$(BIN)/python bench/claim_latency.py
	$(BIN)/python bench/enqueue_throughput.py

clean:
	rm -rf $(VENV) var .pytest_cache
