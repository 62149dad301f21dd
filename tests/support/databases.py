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

from gpulease.store.db import open_database, sqlite_url


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
    """Copies of one migrated PostgreSQL database, made (and dropped) by worker threads.

    At most `READY` copies wait for a test; `take` hands one out, `drop` queues
    one for dropping, and `close` drops what is left and the template.
    """

    READY = 2
    WORKERS = 2

    def __init__(self, server_url: str) -> None:
        self.server = make_url(server_url)
        self.admin = create_engine(self.server, isolation_level="AUTOCOMMIT")
        self.template = f"gl_template_{uuid.uuid4().hex[:12]}"
        self._run(f'CREATE DATABASE "{self.template}"')
        # CREATE DATABASE ... TEMPLATE needs the template without connections.
        open_database(self.url(self.template)).dispose()
        self._ready: queue.Queue[str] = queue.Queue()
        self._to_drop: queue.Queue[str] = queue.Queue()
        self._slots = threading.Semaphore(self.READY)
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._workers = [threading.Thread(target=self._work, name=f"postgres-copies-{i}",
                                          daemon=True) for i in range(self.WORKERS)]
        for worker in self._workers:
            worker.start()

    def url(self, name: str) -> str:
        return self.server.set(database=name).render_as_string(hide_password=False)

    def _run(self, sql: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(sql))

    def _drop_now(self, name: str) -> None:
        self._run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _work(self) -> None:
        try:
            while not self._stop.is_set():
                while not self._to_drop.empty():
                    try:
                        self._drop_now(self._to_drop.get_nowait())
                    except queue.Empty:
                        break
                if self._slots.acquire(timeout=0.1):
                    name = f"gl_test_{uuid.uuid4().hex[:12]}"
                    self._run(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
                    self._ready.put(name)
        except Exception as e:  # told to the test that waits for a copy
            self._error = e

    def take(self) -> str:
        """The name of a migrated, empty database of the caller's own."""
        while True:
            try:
                name = self._ready.get(timeout=0.5)
            except queue.Empty:
                if self._error is not None:
                    raise RuntimeError(f"making a PostgreSQL test database failed: "
                                       f"{self._error}") from self._error
                if not any(w.is_alive() for w in self._workers):
                    raise RuntimeError("the PostgreSQL test databases are closed") from None
                continue
            self._slots.release()
            return name

    def drop(self, name: str) -> None:
        """Drop `name` soon (a worker does it, WITH (FORCE))."""
        self._to_drop.put(name)

    def close(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join()
        for waiting in (self._to_drop, self._ready):
            while not waiting.empty():
                self._drop_now(waiting.get())
        self._drop_now(self.template)
        self.admin.dispose()
