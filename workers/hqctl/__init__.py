"""``hqctl``, the remote administration program (:mod:`workers.hqctl.main`);
``enqueue`` holds SavewebHQ's enqueue and enqueue-source commands."""
from workers.hqctl.main import main

__all__ = ["main"]
