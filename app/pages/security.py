"""Security headers and CSRF for pages (placeholder: being built)."""


def init_app(app) -> None:
    pass
