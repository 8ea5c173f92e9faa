"""Placeholder until the search module lands."""


def index_paper(canonical_key, project_id, text, *, derived_key=None, languages=None):
    return 0
