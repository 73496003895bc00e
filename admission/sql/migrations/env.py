"""Alembic environment: runs on the connection admission's ``db`` commands pass in."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from admission.sql._revisions import VERSION_TABLE
from admission.sql._schema import metadata

config = context.config
VERSION = {"version_table": config.attributes.get("version_table", VERSION_TABLE)}


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=metadata, render_as_batch=True, **VERSION)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=metadata, render_as_batch=True, **VERSION)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("admission migrations run online only: use `admission db upgrade --db URL`")
run_migrations()
