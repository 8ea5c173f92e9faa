"""The master's address as workers and browsers outside should use it.

Behind a TLS proxy the request's own host is the proxy's backend address
(``http://127.0.0.1:8000``), which a worker refuses and GitHub does not
know: ``PUBLIC_URL`` wins whenever it is set.
"""
from __future__ import annotations

from flask import current_app, request, url_for
from flask_babel import lazy_gettext
from werkzeug.routing import BaseConverter


def master_url() -> str:
    """``PUBLIC_URL`` without its trailing slash, else the request's scheme and
    host — never a page's language prefix (``/zh``): the OAuth callback and
    the workers' master URL are the same whatever language asked."""
    public = current_app.config.get("PUBLIC_URL")
    return (public or request.host_url).rstrip("/")


# The one navigation bar: (endpoint, label, first path segment under /admin
# that belongs to it). A job page belongs to its project's section.
ADMIN_SECTIONS = (
    ("admin.dashboard", lazy_gettext("Dashboard"), ("",)),
    ("admin.projects", lazy_gettext("Projects"), ("projects", "jobs")),
    ("admin.workers", lazy_gettext("Workers"), ("workers",)),
    ("admin.sites", lazy_gettext("Sites"), ("sites",)),
    ("admin.users", lazy_gettext("Users"), ("users",)),
    ("admin.hooks", lazy_gettext("Hooks"), ("hooks",)),
    ("admin.search", lazy_gettext("Search"), ("search",)),
    ("admin.audit_log", lazy_gettext("Audit"), ("audit",)),
)


def nav_links(user) -> list[dict]:
    """The header's links for this signed-in user, the current section marked."""
    parts = request.path.strip("/").split("/")
    section = (parts[1] if len(parts) > 1 else "") if parts[0] == "admin" else None
    links = [{"url": url_for(endpoint), "label": label, "current": section in segments}
             for endpoint, label, segments in (ADMIN_SECTIONS if user.is_admin else ())]
    if user.has("reader", "admin"):
        links.append({"url": url_for("documents_pages.index"), "label": lazy_gettext("Documents"),
                      "current": parts[0] == "documents"})
        links.append({"url": url_for("progress_pages.index"), "label": lazy_gettext("Progress"),
                      "current": parts[0] == "progress"})
    links.append({"url": url_for("worker_pages.index"), "label": lazy_gettext("My worker"),
                  "current": parts[0] == "worker"})
    return links


class SegmentConverter(BaseConverter):
    """A page URL's id segment that a browser keeps as it is.

    Identifiers ([A-Za-z0-9._:-]) may be "." or "..", and a browser resolves
    those segments (even percent-encoded, as the URL standard says) before
    it asks: /admin/projects/.. would open /admin/. Such an id is written
    with a "~", which no identifier contains, and read back without it."""

    def to_url(self, value) -> str:
        value = str(value)
        return super().to_url(value + "~" if value in (".", "..") else value)

    def to_python(self, value: str) -> str:
        return value[:-1] if value in (".~", "..~") else value
