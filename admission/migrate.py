"""Schema migrations: alembic, run on admission's own packaged revisions.

``upgrade`` and ``downgrade`` are what ``admission db upgrade`` and
``admission db downgrade`` call.  Nothing here runs at start-up: opening a
store only checks the revision (contract §6).
"""

from __future__ import annotations

from alembic.config import Config
from sqlalchemy import Engine

from admission.schema import current_revision
from alembic import command

__all__ = ["alembic_config", "downgrade", "revision_of", "upgrade"]


def alembic_config(engine: Engine, *, x_arguments: dict[str, str] | None = None) -> Config:
    """An alembic configuration for admission's packaged migrations on ``engine``."""
    config = Config()
    config.set_main_option("script_location", "admission:migrations")
    config.attributes["engine"] = engine
    if x_arguments:
        config.cmd_opts = _XArguments([f"{k}={v}" for k, v in x_arguments.items()])  # type: ignore[assignment]
    return config


class _XArguments:
    """What alembic reads for ``-x`` options when run from code."""

    def __init__(self, x: list[str]) -> None:
        self.x = x


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Upgrade the database to ``revision`` (the head by default); returns the new revision."""
    with engine.begin() as conn:
        config = alembic_config(engine)
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    return revision_of(engine)


def downgrade(engine: Engine, revision: str, *, allow_unsafe: bool = False) -> str | None:
    """Downgrade to ``revision``.

    Refused once receipts with intent digests exist, unless ``allow_unsafe``
    (docs/upgrading.md explains why an older writer is then unsafe).
    """
    x_arguments = {"allow-unsafe-downgrade": "yes"} if allow_unsafe else None
    with engine.begin() as conn:
        config = alembic_config(engine, x_arguments=x_arguments)
        config.attributes["connection"] = conn
        command.downgrade(config, revision)
    return revision_of(engine)


def revision_of(engine: Engine) -> str | None:
    """The revision stamped in the database (``None`` before the first upgrade)."""
    with engine.connect() as conn:
        return current_revision(conn)
