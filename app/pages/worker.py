"""The worker's own page (placeholder: being built)."""
from flask import Blueprint

bp = Blueprint("worker_pages", __name__, url_prefix="/worker")
