"""The host project's alembic environment, with admission's revisions included.

The host's tables are its own metadata; admission's revisions arrive through
``version_locations`` (alembic.ini) under the branch label ``admission``.
Autogenerate compares the host's metadata only: ``include_object`` leaves
admission's tables to admission's own revisions.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Column, DateTime, MetaData, String, Table, engine_from_config, pool

from admission.sql import host_include_object, prepare_host_database

config = context.config

# The host's own schema: one table, as a workflow engine would keep it.
host_metadata = MetaData()
Table(
    "engine_schedules",
    host_metadata,
    Column("id", String(36), primary_key=True),
    Column("workflow_id", String(255), nullable=False),
    Column("next_fire_at", DateTime(timezone=True), nullable=True),
)


def database_url() -> str:
    """``-x db=URL`` on the command line, else the ini's ``sqlalchemy.url``."""
    return context.get_x_argument(as_dictionary=True).get("db") or config.get_main_option("sqlalchemy.url")


def run_migrations_online() -> None:
    engine = engine_from_config(
        {"sqlalchemy.url": database_url()}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=host_metadata,
            include_object=host_include_object,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            # A database admission upgraded on its own keeps its revision in
            # admission_alembic_version: hand it to this history first.
            prepare_host_database(connection)
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("this recipe runs online; see docs/upgrading.md for admission's offline SQL")
run_migrations_online()
