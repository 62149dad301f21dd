"""gpulease.store: the database (issue "One way down").

What belongs here: the tables and the engine (advisory locks included), the
alembic migrations, one store per group of tables (accounts, audit,
identities, notices, profiles, reservations, member caps, billing reports,
assignments, the queue, the ledger, sessions, limits). The context that hands
them to the hub and the spawners is spawners/context.py.

What it may import: gpulease.host, gpulease.core, the standard library and the
database's packages (SQLAlchemy, alembic). Never gpulease.spawners or
gpulease.hub (the "one way" layers hub -> spawners -> store -> host -> core in
pyproject.toml).
"""
