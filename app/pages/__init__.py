"""Server-rendered pages: sign-in (GitHub), admin pages, the worker's own page.

Pages accept only a browser session; ``/api/`` accepts only bearer tokens.
"""
from __future__ import annotations


def init_app(app) -> None:
    from app.pages import admin, auth, documents, progress, security, worker
    from app.pages.links import SegmentConverter
    app.url_map.converters["segment"] = SegmentConverter  # before the page routes are added
    auth.init_app(app)
    security.init_app(app)
    app.register_blueprint(auth.bp)
    app.register_blueprint(admin.bp)
    app.register_blueprint(worker.bp)
    app.register_blueprint(progress.bp)
    app.register_blueprint(documents.bp)
    from app.pages.links import nav_links
    app.jinja_env.globals["nav_links"] = nav_links
