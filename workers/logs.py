"""One logging setup for every FleetHQ process — web, tasks, clock, the
master's fetcher and consume watcher, the command line, and the workers —
on structlog.

Every line carries an ISO-8601 time in UTC (``…Z``), the level, the logger,
the process's role and pid, the message, the request id of the web request
it serves or that led to it (a task run for a request's outbox hint carries
that request's id), and the fields a call passes in ``extra``. The form:

- JSON, one object per line, when stderr is not a terminal (production:
  systemd, containers, log shippers) or ``FLEETHQ_LOG_JSON=true``;
- readable columns when stderr is a terminal or ``FLEETHQ_LOG_JSON=false``.

Records of the standard ``logging`` module (Flask, gunicorn, Dramatiq,
SQLAlchemy, FleetHQ's own ``logging.getLogger`` loggers) go through the same
processors by ``structlog.stdlib.ProcessorFormatter``, so a process has one
format whoever logs. This module lives on the worker side because the worker
installs without the master; the master imports it.
"""
from __future__ import annotations

import logging
import os
import sys

import structlog

JSON_SETTING = "FLEETHQ_LOG_JSON"
LEVEL_SETTING = "FLEETHQ_LOG_LEVEL"
# A process started by another under a role of its own (the master's
# fetcher runs the worker program) says so here; it wins over the entry
# point's default role.
PROCESS_SETTING = "FLEETHQ_PROCESS"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

bind = structlog.contextvars.bind_contextvars
unbind = structlog.contextvars.unbind_contextvars
clear = structlog.contextvars.clear_contextvars


def bound() -> dict:
    """What this thread or task has bound (``request_id`` …)."""
    return structlog.contextvars.get_contextvars()


def wants_json(setting=None, stream=None) -> bool:
    """JSON unless told otherwise or writing to a terminal. ``setting``: a
    bool, "true"/"false", or None/"auto" (then ``FLEETHQ_LOG_JSON``, then
    whether ``stream`` is a terminal)."""
    if setting is None or setting == "auto":
        setting = os.environ.get(JSON_SETTING, "auto")
    if isinstance(setting, bool):
        return setting
    text = str(setting).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    stream = stream or sys.stderr
    return not (hasattr(stream, "isatty") and stream.isatty())


class _Role:
    """Adds the process's role and pid (the pid read per line: gunicorn and
    Dramatiq fork after configuring)."""

    def __init__(self, role: str):
        self.role = role

    def __call__(self, _logger, _name, event: dict) -> dict:
        event.setdefault("process", self.role)
        event.setdefault("pid", os.getpid())
        return event


def _drop_formatter_leftovers(_logger, _name, event: dict) -> dict:
    """``message`` and ``asctime`` are what another formatter (a test
    runner's) left on the record, not fields a call passed."""
    event.pop("message", None)
    event.pop("asctime", None)
    return event


def _shared(role: str) -> list:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
        _drop_formatter_leftovers,
        _Role(role),
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
    ]


def _event_as_msg(_logger, _name, event: dict) -> dict:
    """JSON lines name the message ``msg`` (as FleetHQ's logs always have),
    not structlog's ``event``."""
    if "event" in event:
        event["msg"] = event.pop("event")
    return event


def formatter(role: str, *, json=None, stream=None) -> logging.Formatter:
    """The formatter every handler of a FleetHQ process uses."""
    if wants_json(json, stream):
        tail = [structlog.processors.format_exc_info, _event_as_msg,
                structlog.processors.JSONRenderer(ensure_ascii=False)]
    else:
        tail = [structlog.dev.ConsoleRenderer(colors=False, timestamp_key="ts", pad_event_to=36,
                                              exception_formatter=structlog.dev.plain_traceback,
                                              sort_keys=False)]
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared(role),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail])


class _Handler(logging.StreamHandler):
    """The handler ``configure`` adds (known again on a second call). It
    writes where stderr was when configured; if that stream was closed since
    (a command runner's capture), to the process's own stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self.stream, "closed", False):
            self.stream = sys.__stderr__
        super().emit(record)


def configure(role: str, *, json=None, level=None, stream=None, adopt: tuple[str, ...] = ()) -> None:
    """Route this process's log records through one renderer.

    Adds a stderr handler to the root logger (replacing one an earlier call
    added), and gives the handlers already on the loggers named in ``adopt``
    ("" is the root) the same format, so lines that go where Dramatiq or
    gunicorn send them (a pipe to the parent, the error log) read the same.
    ``level`` unset: ``FLEETHQ_LOG_LEVEL``, else INFO.
    """
    level = level or os.environ.get(LEVEL_SETTING) or "INFO"
    role = os.environ.get(PROCESS_SETTING) or role
    fmt = formatter(role, json=json, stream=stream or sys.stderr)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(handler)
    adopted = [h for name in adopt for h in logging.getLogger(name).handlers]
    for handler in adopted:
        handler.setFormatter(fmt)
    if "" not in adopt or not root.handlers:
        ours = _Handler(stream or sys.stderr)
        ours.setFormatter(fmt)
        root.addHandler(ours)
    root.setLevel(level if isinstance(level, int) else str(level).upper())
    structlog.configure(
        processors=[*_shared(role), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def configured() -> bool:
    """Whether ``configure`` ran in this process (an entry point named its role)."""
    return any(isinstance(h, _Handler) or isinstance(h.formatter, structlog.stdlib.ProcessorFormatter)
               for h in logging.getLogger().handlers)
