"""Sign-in with GitHub (placeholder: being built)."""
from flask import Blueprint

bp = Blueprint("auth", __name__)


def init_app(app) -> None:
    pass
