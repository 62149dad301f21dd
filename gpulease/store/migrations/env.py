"""Alembic environment for gpulease's database.

Run programmatically by `gpulease.store.db.upgrade`, which passes the
connection in `config.attributes["connection"]`.
"""

from alembic import context

from gpulease.store.db import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("gpulease migrations run through gpulease.store.db.upgrade()")

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
