"""Uploads of pdf attempts: spool, verification, archive commit, assets, receipts."""
