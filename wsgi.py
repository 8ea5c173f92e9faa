"""WSGI entry point: ``gunicorn wsgi:app``."""
from app import config, create_app

with config.reported():
    app = create_app()
