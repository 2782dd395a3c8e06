"""The WSGI entry point: ``gunicorn wsgi:app`` serves every op once REDIS_URL is set."""

from app import create_app

app = create_app()
