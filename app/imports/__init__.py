"""Imports of other job trackers' databases into FleetHQ's schema.

``savewebhq`` carries a SavewebHQ tracker database (its ``tracker_*``
tables) over in one transaction: ``flask fleet import-savewebhq``.
"""
