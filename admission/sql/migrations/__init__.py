"""Alembic migrations of admission's schema, shipped inside the package."""
