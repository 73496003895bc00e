"""Alembic environment: runs on the connection admission's ``db`` commands pass in.

Offline (``--sql``, or ``admission.sql.upgrade_sql``), nothing connects: the
SQL is rendered for the dialect of ``config.attributes["url"]`` (or of
``sqlalchemy.url``, or ``config.attributes["dialect_name"]``), with literal
values, into the configuration's output buffer.
"""

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


def run_migrations_offline() -> None:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    dialect_name = config.attributes.get("dialect_name")
    if url is None and dialect_name is None:
        raise SystemExit("offline migrations need the database URL or a dialect name to render SQL for")
    context.configure(
        url=url,
        dialect_name=dialect_name,
        target_metadata=metadata,
        render_as_batch=True,
        literal_binds=True,
        # A named paramstyle leaves a literal % alone (the PL/pgSQL fence's
        # RAISE format); pyformat drivers would print it doubled.
        dialect_opts={"paramstyle": "named"},
        # One transaction around the whole script, on SQLite as well, as the
        # online upgrade has: a script that fails half-way leaves nothing.
        transactional_ddl=True,
        **VERSION,
    )
    with context.begin_transaction():
        # What the online upgrade does before alembic runs (the PostgreSQL
        # schema, a legacy stamp's move), rendered by admission.sql._migrate.
        for statement in config.attributes.get("offline_prelude", ()):
            context.execute(statement)
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations()
