"""The WSGI entry point: ``gunicorn wsgi:app`` serves every op once REDIS_URL is set."""

from app import create_app
from app.logs import configure_logging

configure_logging()
app = create_app()
