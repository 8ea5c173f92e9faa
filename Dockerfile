# The master image: web, tasks, clock and the release step all run from it
# (docker-compose.yml picks the command). Build: docker build -t fleethq .
FROM python:3.11-slim-bookworm

# The code runs from the source tree (templates/ and migrations/ are found
# next to app/), so it is put on the path instead of being pip-installed.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/srv/fleethq \
    FLEETHQ_DATA_DIR=/data \
    FLEETHQ_BIND=0.0.0.0:8400

WORKDIR /srv/fleethq

# WITH_FETCHER=true: the image of the local fetcher (flask fleet local-worker),
# which runs the worker program too: Debian's Chromium and the worker extras,
# and Tesseract with the orientation pack and the language packs in
# OCR_LANGUAGES (the languages the OCR profiles name: the local lane of a
# split OCR setup, ``-- --task ocr``, reads them; docs/documents.md).
ARG WITH_FETCHER=false
ARG OCR_LANGUAGES="eng pol"
ENV PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 \
    FLEETHQ_CHROMIUM=/usr/bin/chromium
RUN if [ "$WITH_FETCHER" = "true" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends chromium fonts-liberation ca-certificates \
            tesseract-ocr tesseract-ocr-osd unpaper $(for lang in $OCR_LANGUAGES; do echo "tesseract-ocr-$lang"; done) \
        && rm -rf /var/lib/apt/lists/*; \
    fi

# Dependencies in their own layer: rebuilt only when pyproject.toml changes.
COPY pyproject.toml ./
RUN WITH_FETCHER="$WITH_FETCHER" python -c "import os, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + (p['optional-dependencies']['worker'] if os.environ['WITH_FETCHER'] == 'true' else [])))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY wsgi.py ./
COPY app ./app
COPY tasks ./tasks
COPY workers ./workers
COPY migrations ./migrations
COPY templates ./templates
# The page catalogs are compiled here (the .mo files are build output).
RUN pybabel compile -d app/translations

# Never run as root. /data holds the spool and the local object store: web
# and tasks must share it (uploads are staged by web, archived by tasks).
RUN useradd --system --uid 10001 --user-group --home-dir /data fleethq \
    && mkdir -p /data /fetcher && chown fleethq:fleethq /data /fetcher
USER fleethq
VOLUME ["/data"]
EXPOSE 8400

CMD ["gunicorn", "-c", "python:app.gunicorn_conf", "wsgi:app"]
