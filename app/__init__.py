"""The FleetHQ master: ``create_app`` binds configuration, extensions and blueprints."""
from __future__ import annotations

import logging

from flask import Flask

# Alembic announces each of its built-in plugins at INFO when it is first
# imported (by app.extensions, below), which every process start (tasks,
# clock, flask commands) would log.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

from app import config as config_module  # noqa: E402
from app.extensions import db, migrate  # noqa: E402


def create_app(config: dict | None = None, *, check_schema: bool = True,
               outbox_sender=None) -> Flask:
    """``outbox_sender`` (an ``app.outbox.Sender``) carries the outbox's
    after-commit hints; without one, ``OUTBOX_SENDER`` chooses it."""
    app = Flask(__name__, template_folder="../templates")
    # Keep documented field order in responses; sorting also costs time on hot routes.
    app.json.sort_keys = False
    app.config.update(config_module.load(config))
    if int(app.config["TRUSTED_PROXIES"]) > 0:
        from werkzeug.middleware.proxy_fix import ProxyFix
        hops = int(app.config["TRUSTED_PROXIES"])
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops)
    if not app.config.get("SECRET_KEY"):
        import secrets
        app.config["SECRET_KEY"] = secrets.token_hex(32)
        # A key of this process alone: nothing sealed under it (machine
        # tokens) could be opened by another process or after a restart.
        app.config["SECRET_KEY_GENERATED"] = True

    from app.ops import logging as ops_logging
    ops_logging.init_app(app)

    db.init_app(app)
    from app.extensions import ping_idle_connections, transactional_checkouts
    with app.app_context():
        for engine in db.engines.values():
            ping_idle_connections(engine)
            transactional_checkouts(engine)
    migrate.init_app(app, db, directory=_migrations_dir())

    # Import the models so that metadata (migrations, drift test) sees every table.
    from app.accounts import models as _accounts  # noqa: F401
    from app.audit import models as _audit  # noqa: F401
    from app.documents import models as _documents  # noqa: F401
    from app.fleet import models as _fleet  # noqa: F401
    from app.hooks import models as _hooks  # noqa: F401
    from app.imports import models as _imports  # noqa: F401
    from app.ops import models as _ops  # noqa: F401
    from app.pages import models as _pages  # noqa: F401
    from app.projects import models as _projects  # noqa: F401
    from app.search import models as _search  # noqa: F401
    from app.sites import models as _sites  # noqa: F401
    from app.uploads import models as _uploads  # noqa: F401

    from app.api import init_app as init_api
    init_api(app)
    from app.pages import init_app as init_pages
    init_pages(app)
    # The machine API takes bearer tokens only: no cookie, nothing to forge.
    from app.api import bp as api_bp
    from app.pages.security import csrf
    csrf.exempt(api_bp)
    from app import i18n
    i18n.init_app(app)
    from app.api import health
    from app.ops import metrics
    health.init_app(app)
    metrics.init_app(app)

    from app import cli
    cli.init_app(app)

    from app import outbox
    outbox.install(app, _outbox_sender(app.config) if outbox_sender is None else outbox_sender)

    # Outermost: a token worker's plain completion or renewal is answered
    # before Flask's request machinery runs (app/api/hot_path.py).
    from app.api.hot_path import HotPath
    app.wsgi_app = HotPath(app, app.wsgi_app)  # type: ignore[method-assign]

    if check_schema:
        from app.ops import schema
        schema.refuse_newer_schema(app)
    return app


def _outbox_sender(config):
    """``recording`` keeps hints in memory (tests); ``dramatiq`` sends them
    to the tasks process. The one place in app/ that knows the tasks package:
    this is where the parts are put together."""
    from app import outbox
    if config["OUTBOX_SENDER"] == "recording":
        return outbox.RecordingSender()
    import tasks
    from tasks.sender import DramatiqSender
    return DramatiqSender(tasks.make_broker(config))


def _migrations_dir() -> str:
    import os
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "migrations")
