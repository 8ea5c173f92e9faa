"""Admin pages (DESIGN §10): one blueprint (:mod:`.base`), its views split
along their seams: dashboard, projects, enqueue, jobs (and bulk actions, job
lookups), workers, users, hooks, search, audit, documents. Importing the
package registers every view on :data:`bp`."""
from __future__ import annotations

from app.pages.admin import (audit, bulk, dashboard, documents, enqueue, hooks, jobs,  # noqa: F401
                             projects, search, sites, users, workers)
from app.pages.admin.base import bp

__all__ = ["bp"]
