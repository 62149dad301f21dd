"""Migrated, empty gpulease databases for tests, made without migrating each one.

Migrating a database costs tens of milliseconds on SQLite and a few tenths of
a second on PostgreSQL, where creating the database costs as much again;
some 350 tests each want one. So each session migrates one template per
backend, and every test gets a copy of its own: a file copy on SQLite; on
PostgreSQL, `CREATE DATABASE ... TEMPLATE`, made ahead by a thread while the
tests before it run (the server does the copying, not the test process).
Each copy is still a database of the test's own, dropped after it.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import uuid
from pathlib import Path

from sqlalchemy import create_engine, make_url, text

from gpulease.hub.db import open_database, sqlite_url


class SqliteTemplate:
    """One migrated SQLite file; `copy_to` gives a test a copy of it."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "template.sqlite"
        open_database(sqlite_url(self.path)).dispose()

    def copy_to(self, path: Path) -> str:
        # The backup API copies what WAL mode holds outside the main file too.
        with sqlite3.connect(self.path) as source, sqlite3.connect(path) as target:
            source.backup(target)
        source.close()
        target.close()
        return sqlite_url(path)


class PostgresCopies:
    """Copies of one migrated PostgreSQL database, `READY` of them made ahead."""

    READY = 2

    def __init__(self, server_url: str) -> None:
        self.server = make_url(server_url)
        self.admin = create_engine(self.server, isolation_level="AUTOCOMMIT")
        self.template = f"gl_template_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.template}"'))
        # CREATE DATABASE ... TEMPLATE needs the template without connections.
        open_database(self.url(self.template)).dispose()
        self._ready: queue.Queue[str] = queue.Queue(self.READY)
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._maker = threading.Thread(target=self._make, name="postgres-copies", daemon=True)
        self._maker.start()

    def url(self, name: str) -> str:
        return self.server.set(database=name).render_as_string(hide_password=False)

    def _make(self) -> None:
        try:
            with self.admin.connect() as conn:
                while not self._stop.is_set():
                    name = f"gl_test_{uuid.uuid4().hex[:12]}"
                    conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
                    while True:
                        try:
                            self._ready.put(name, timeout=0.5)
                            break
                        except queue.Full:
                            if self._stop.is_set():
                                self.drop(name)
                                return
        except Exception as e:  # told to the test that waits for a copy
            self._error = e

    def take(self) -> str:
        """The name of a migrated, empty database of the caller's own."""
        while True:
            try:
                return self._ready.get(timeout=0.5)
            except queue.Empty:
                if self._error is not None:
                    raise RuntimeError(f"making a PostgreSQL test database failed: "
                                       f"{self._error}") from self._error
                if not self._maker.is_alive():
                    raise RuntimeError("the PostgreSQL test databases are closed") from None

    def drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        self._stop.set()
        self._maker.join()
        while not self._ready.empty():
            self.drop(self._ready.get())
        self.drop(self.template)
        self.admin.dispose()
