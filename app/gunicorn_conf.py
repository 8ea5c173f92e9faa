"""Gunicorn settings for the ``web`` process: ``gunicorn -c python:app.gunicorn_conf wsgi:app``.

Environment: ``FLEETHQ_BIND`` (else ``0.0.0.0:$PORT`` if ``PORT`` is set, else
127.0.0.1:8400), ``FLEETHQ_WEB_WORKERS``
(or the conventional ``WEB_CONCURRENCY``; default 2), ``FLEETHQ_WEB_THREADS``
(default 16), ``FLEETHQ_KEEPALIVE_S`` (idle keep-alive, default 75),
``FLEETHQ_HEADER_TIMEOUT_S`` (default 10) and ``FLEETHQ_BODY_IDLE_S``
(default 60) (app/web_worker.py), ``PROMETHEUS_MULTIPROC_DIR``.
"""
import os
import shutil
import tempfile

from gunicorn import glogging

# PORT: Procfile platforms (Heroku, Dokku) say where to listen this way.
bind = os.environ.get("FLEETHQ_BIND") or (
    f"0.0.0.0:{os.environ['PORT']}" if os.environ.get("PORT") else "127.0.0.1:8400")
workers = int(os.environ.get("FLEETHQ_WEB_WORKERS") or os.environ.get("WEB_CONCURRENCY") or 2)
# Threads, not async workers: a long-polling claim (wait_ms up to 30 s) holds
# one thread, so each worker process needs many of them.
# gthread with a deadline on each read of a request (app/web_worker.py): a
# client that trickles its header cannot hold a thread past 10 s.
worker_class = "app.web_worker.BoundedReadsWorker"
threads = int(os.environ.get("FLEETHQ_WEB_THREADS") or 16)
timeout = 60
# Idle keep-alive connections stay open this long (gunicorn's default is 2 s).
# SavewebHQ's server keeps them 60 s and its Python SDK holds one connection
# open between calls, so a worker that pauses longer than 2 s between jobs
# met a closed connection ("Broken pipe"). Longer than nginx's upstream
# keepalive_timeout (60 s), so the proxy, not gunicorn, closes first and
# never sends on a connection gunicorn is closing. Idle connections wait in
# the gthread poller, not on a thread.
keepalive = int(os.environ.get("FLEETHQ_KEEPALIVE_S") or 75)
# Lets in-flight long polls (≤ 30 s) answer before a graceful restart kills them.
graceful_timeout = 35
# The master loads the app before it forks the workers, so the code and the
# objects every worker would import alike are pages they share (copy on
# write) instead of a copy each; post_fork gives each worker database
# connections of its own. Measured by bench/vs_savewebhq.py: idle PSS of the
# web process tree (master and two workers) 220 MB -> 159 MB after a run.
preload_app = True
# gunicorn's control socket defaults to one path per user home, so two masters
# on one host (dev stack, tests, benchmarks) would clash; nothing here uses it.
control_socket_disable = True


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass
    return True


def _multiproc_dir() -> str:
    """A fresh directory for prometheus_client's per-process files.

    It must be set before the workers fork (prometheus_client picks its value
    class at import) and be empty at start, or stale files of an earlier run
    would be summed into the counters.
    """
    base = os.path.join(os.environ.get("FLEETHQ_DATA_DIR", "var"), "prometheus")
    try:
        os.makedirs(base, exist_ok=True)
        # Left behind by masters that were killed: dead pids, and our own pid
        # (in a container the master is pid 1 at every start).
        for name in os.listdir(base):
            pid = name[len("web-"):]
            if name.startswith("web-") and (pid == str(os.getpid()) or not _alive(pid)):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        path = os.path.join(base, f"web-{os.getpid()}")
        os.makedirs(path)
        return path
    except OSError:  # read-only data dir (some containers): fall back to a tempdir
        return tempfile.mkdtemp(prefix="fleethq-prometheus-")


_owned_multiproc_dir = None
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _owned_multiproc_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"] = _multiproc_dir()


class _Logger(glogging.Logger):
    """gunicorn's own lines (its error log, access log if enabled) and the
    app's in FleetHQ's one format (workers/logs.py), from gunicorn's first
    line on: its logging setup runs before any server hook."""

    def setup(self, cfg):
        super().setup(cfg)
        from workers import logs
        logs.configure("web", adopt=("gunicorn.error", "gunicorn.access"))


logger_class = _Logger


def on_starting(server):
    # Settings are checked in the master, before any worker forks: a bad one
    # stops gunicorn with one line instead of every worker failing to boot
    # with a traceback, over and over.
    from app import config
    with config.reported():
        config.load()


def child_exit(server, worker):
    # Drops the live gauges of the dead worker; its counters are kept.
    from prometheus_client import multiprocess
    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    # After a USR2 binary upgrade the new master (reexec_pid) inherits the
    # directory: leave it; a later fresh start removes it once that pid is gone.
    if _owned_multiproc_dir and not server.reexec_pid:
        shutil.rmtree(_owned_multiproc_dir, ignore_errors=True)


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


def pre_fork(server, worker):
    # Objects that exist before the fork are left out of the worker's garbage
    # collections: a collection writes to every object it visits, which would
    # copy the pages preload_app shares.
    import gc
    gc.freeze()


def post_fork(server, worker):
    """A worker's own database connections, then its allocator settings.

    The master's schema check (create_app, loaded before the fork) left a
    connection in the pools; a socket two processes use is corrupted by the
    first query of both, so each worker drops what it inherited (without
    closing it: the master still owns it) and connects afresh.

    Keep freed upload buffers in the worker's heap.

    Upload bodies arrive in 1 MiB pieces, and each piece is copied a few times
    on its way from the socket to the spool. With glibc's defaults most of
    those buffers are mmapped or trimmed on free and faulted in again, page
    by page, for the next piece: measured by bench/upload_ingest.py, that
    page-fault work is a good part of the web process's CPU. Serving
    allocations below 8 MiB from the heap and trimming it only above 16 MiB
    of free space keeps the pages mapped. What stays mapped is at most what
    the concurrent uploads used at their peak (a few MiB each), so peak RSS
    does not grow; it just is not handed back between requests.

    Two malloc arenas, not glibc's up to eight per core: each request thread
    would otherwise get an arena of its own, and each would keep its share of
    those buffers (with S3 staging the boto3 client's too). Measured by
    bench/upload_ingest.py --spool s3: peak worker RSS 155 MB with the
    default, 139 MB with two. ``MALLOC_ARENA_MAX`` in the environment wins.
    """
    from app.extensions import forget_inherited_connections
    forget_inherited_connections()

    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(_M_MMAP_THRESHOLD, 8 * 1024 * 1024)
        libc.mallopt(_M_TRIM_THRESHOLD, 16 * 1024 * 1024)
        if not os.environ.get("MALLOC_ARENA_MAX"):
            libc.mallopt(_M_ARENA_MAX, 2)
    except (OSError, AttributeError):  # not glibc (musl, say): keep its defaults
        server.log.debug("mallopt unavailable; allocator defaults kept")


def post_worker_init(worker):
    """Sweep this host's scratch spool once the app is loaded, once per start.

    With s3 staging an upload streams into the web process's own spool
    directory, which no tasks process ever sees; a web process killed in the
    middle of uploads leaves its part files there. This removes those
    no live upload owns (a finished or superseded generation at once, one
    without any upload row after the sweeper's grace), as the spool sweeper
    does for the directory it can see. Only the master's first worker
    (``age`` 1) does it: the others would list the same directory again.
    """
    if worker.age != 1:
        return
    from app.uploads import sweeper
    from app.uploads.spool import Spool

    app = worker.wsgi
    try:
        with app.app_context():
            removed = sweeper.remove_orphans(Spool.from_config(app.config), local_only=True)
        if removed:
            worker.log.info("removed %d leftover spool file(s)", removed)
    except Exception as exc:  # the database may be down at boot: the next start sweeps
        worker.log.warning("spool sweep at start skipped: %s", str(exc).splitlines()[0][:200])
