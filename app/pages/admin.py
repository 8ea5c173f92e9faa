"""Admin pages (placeholder: being built)."""
from flask import Blueprint

bp = Blueprint("admin", __name__, url_prefix="/admin")
