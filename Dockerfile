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

# Dependencies in their own layer: rebuilt only when pyproject.toml changes.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY wsgi.py ./
COPY app ./app
COPY tasks ./tasks
COPY workers ./workers
COPY migrations ./migrations
COPY templates ./templates

# Never run as root. /data holds the spool and the local object store: web
# and tasks must share it (uploads are staged by web, archived by tasks).
RUN useradd --system --uid 10001 --user-group --home-dir /data fleethq \
    && mkdir -p /data && chown fleethq:fleethq /data
USER fleethq
VOLUME ["/data"]
EXPOSE 8400

CMD ["gunicorn", "-c", "python:app.gunicorn_conf", "wsgi:app"]
