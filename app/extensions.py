"""Extensions, created unbound; ``create_app`` binds them."""
import functools
import re
from typing import Any, cast

import psycopg
from psycopg.rows import namedtuple_row, tuple_row
from psycopg.pq import ExecStatus

from flask import current_app
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from flask_sqlalchemy.session import Session
from sqlalchemy import CursorResult, MetaData
from sqlalchemy.exc import DBAPIError

# Stable constraint names keep Alembic autogenerate and the drift test honest.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

FLEET_BIND = "fleet"


class RoutedSession(Session):
    """Worker traffic (fleet and job routes) runs on its own connection pool
    (DESIGN §12), so busy admin pages can never starve heartbeats, claims and
    uploads of connections, nor the other way round. The routes mark their
    request's session with ``use_fleet_pool`` (kept in the session's own
    ``info``: looking up ``g`` on every statement costs the hot routes); the
    session ends with the request, everything else uses the default pool.
    """

    def get_bind(self, mapper=None, clause=None, bind=None, **kwargs):
        if bind is None and self.info.get(FLEET_BIND):
            return self._db.engines[FLEET_BIND]
        return super().get_bind(mapper=mapper, clause=clause, bind=bind, **kwargs)


def use_fleet_pool() -> None:
    """Run the rest of this request's statements on the fleet pool."""
    db.session.info[FLEET_BIND] = True


def forget_inherited_connections() -> None:
    """In a process just forked from one that used the database: drop the
    pooled connections it inherited, without closing them (they are the
    parent's), so that this process opens its own."""
    for engines in list(db._app_engines.values()):
        for engine in engines.values():
            engine.dispose(close=False)


def statements_commit_alone() -> None:
    """Let each of this request's statements commit on its own.

    For the worker routes whose one write is a single statement (a completion,
    a lease renewal): the statement is atomic by itself, and without a
    transaction around it neither a ``BEGIN`` nor a ``COMMIT`` costs a round
    trip (the Go SDK sends one such request per job). Must come before the
    request's first statement; the pool restores the connection's mode. A
    session already in a transaction (a caller's app context, as in tests)
    keeps it: the request's statements then commit with it.
    """
    if not db.session().in_transaction():
        db.session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


_NAMED = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")   # SQLAlchemy's own rule for text()


@functools.lru_cache(maxsize=64)
def driver_sql(sql: str) -> str:
    """``:name`` parameters (SQLAlchemy's) as ``%(name)s`` (psycopg's); ``::`` casts stay."""
    return _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))


def app_cache(name: str, app=None) -> dict:
    """A process cache that belongs to ``app`` (default: the current app),
    kept in its ``extensions``: two apps in one process (tests, ``flask
    fleet --database-url``) never see each other's entries. For small memos
    of database answers, each bounded by its owner."""
    caches = (current_app if app is None else app).extensions.setdefault("fleethq.caches", {})
    return caches.setdefault(name, {})


def driver_rows(driver, sql: str, params: dict, *, named: bool = False) -> list[Any]:
    """Run one statement (``:name`` parameters) on a psycopg connection and
    return its rows as tuples (named tuples with ``named``); none for a
    statement that returns no rows. psycopg's errors pass through."""
    with driver.cursor(row_factory=namedtuple_row if named else tuple_row) as cursor:
        cursor.execute(driver_sql(sql), params)
        # The result's status, not cursor.description: that builds a column
        # object per column of every statement.
        result = cursor.pgresult
        return cursor.fetchall() if result is not None and result.status == ExecStatus.TUPLES_OK else []


def fetch_rows(sql: str, params: dict, *, named: bool = False) -> list[Any]:
    """Run one of the worker routes' fixed statements in the session's
    transaction, straight through psycopg, and return its rows as tuples.

    For the few statements every claim and outcome runs: SQLAlchemy's
    execution layers (compiled-cache lookup, parameter processing, result
    metadata) cost about as much web CPU as the driver itself, and these
    statements need none of it. Driver errors come out as SQLAlchemy's
    exceptions, as from ``db.session.execute``, and a connection the driver
    found broken is invalidated so that the pool replaces it.

    ``named``: rows are named tuples, read by column name (each column of
    the statement needs a distinct name).
    """
    connection = db.session.connection()
    driver = connection.connection.driver_connection
    try:
        return driver_rows(driver, sql, params, named=named)
    except psycopg.Error as exc:
        broken = driver.broken
        if broken:
            connection.invalidate()
        raise DBAPIError.instance(sql, params, exc, psycopg.Error,
                                  connection_invalidated=broken) from None


db = SQLAlchemy(metadata=MetaData(naming_convention=NAMING),
                session_options={"class_": RoutedSession})
migrate = Migrate()
# The models' base class, named for type checkers: Flask-SQLAlchemy builds
# db.Model at run time, which mypy cannot follow.
Model: Any = db.Model


def changed(statement, params: dict | None = None) -> int:
    """Run a data-changing statement in the session's transaction; the rows it changed."""
    result = db.session.execute(statement, params or {})
    return cast(CursorResult, result).rowcount


# A pooled connection idle longer than this is pinged before use; one handed
# back moments ago is not. Under load that saves a round trip per request (the
# claim + complete cycle is four round trips without it, six with
# ``pool_pre_ping``); after a database restart, a connection used within this
# window fails its request once, and SQLAlchemy then retires the whole pool.
PING_AFTER_IDLE_S = 2.0


def transactional_checkouts(engine) -> None:
    """Every connection ``engine``'s pool hands out is in transactional mode.

    The hot path (app/api/hot_path.py) and ``statements_commit_alone`` put
    connections in autocommit and restore them; a connection that came back
    to the pool still in autocommit by any other way would make the next
    request's statements commit one by one — its row locks gone at once, a
    failure half-way leaving half a transition (once seen: a skipped OCR
    attempt marked done whose hook delivery never closed, and a
    ``SAVEPOINT can only be used in transaction blocks`` error). psycopg
    changes nothing when the mode is already off."""
    from sqlalchemy import event

    @event.listens_for(engine, "checkout")
    def _transactional(dbapi_connection, record, proxy):
        if getattr(dbapi_connection, "autocommit", False):
            dbapi_connection.autocommit = False


def ping_idle_connections(engine) -> None:
    """Install the idle-only liveness check on ``engine``'s pool."""
    import time

    from sqlalchemy import event, exc

    @event.listens_for(engine, "checkin")
    def _stamp(dbapi_connection, record):
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection, record, proxy):
        idle_since = record.info.pop("idle_since", None)
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
            return  # brand new, or in use a moment ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as error:  # the pool retries the checkout on a fresh connection
            raise exc.DisconnectionError(str(error)) from error
