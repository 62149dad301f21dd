"""Shared fixtures: gpulease's database on SQLite and, where configured, PostgreSQL.

`GPULEASE_TEST_POSTGRES_URL` names a PostgreSQL server (CI sets it to the
machine's server). Each test that uses `db_url` gets a database of its own,
created and dropped on that server, so tests never see each other's rows and
the shared server is never taken down.
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, make_url, text

from gpulease.store.db import open_database
from tests.support import browser_cookies
from tests.support.databases import PostgresCopies, SqliteTemplate

browser_cookies.install()  # Domain=localhost cookies kept as browsers keep them

POSTGRES_URL = os.environ.get("GPULEASE_TEST_POSTGRES_URL", "")
IN_CI = os.environ.get("CI", "").lower() == "true"

DB_KINDS = ["sqlite", "postgres"]


def _postgres_or_skip() -> str:
    if POSTGRES_URL:
        return POSTGRES_URL
    if IN_CI:
        pytest.fail("CI=true but GPULEASE_TEST_POSTGRES_URL is not set: .ci/run must set it")
    pytest.skip("PostgreSQL tests need GPULEASE_TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1:5432/test)")


def _normalise(url: str) -> str:
    # SQLAlchemy 2.1 maps plain postgresql:// to psycopg (v3), which we ship.
    return url


def _fresh_postgres_database() -> Iterator[str]:
    server = make_url(_normalise(_postgres_or_skip()))
    name = f"gl_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database; dropped after the test."""
    yield from _fresh_postgres_database()


@pytest.fixture(scope="module")
def module_postgres_database() -> Iterator[str]:
    """The same for a module (its one hub); dropped after the module."""
    yield from _fresh_postgres_database()


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory) -> SqliteTemplate:
    return SqliteTemplate(tmp_path_factory.mktemp("sqlite-template"))


@pytest.fixture(scope="session")
def _postgres_copies() -> Iterator[PostgresCopies]:
    copies = PostgresCopies(_normalise(_postgres_or_skip()))
    yield copies
    copies.close()


@pytest.fixture(params=DB_KINDS)
def db_url(request, tmp_path) -> Iterator[str]:
    """gpulease's database URL, once on SQLite and once on PostgreSQL: a migrated,
    empty database of the test's own (a copy of one migrated once: tests/support/databases.py)."""
    if request.param == "sqlite":
        yield request.getfixturevalue("_sqlite_template").copy_to(tmp_path / "gpulease.sqlite")
        return
    copies = request.getfixturevalue("_postgres_copies")
    name = copies.take()
    try:
        yield copies.url(name)
    finally:
        copies.drop(name)


@pytest.fixture
def engine(db_url):
    """An engine on a migrated, empty gpulease database."""
    eng = open_database(db_url)
    yield eng
    eng.dispose()


# --- browser tests: a screenshot of every page when one fails ------------------
pytest_plugins = ["tests.support.browser"]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    if call.excinfo is not None:
        # Garbage (a test's pending asyncio tasks, say) finalised while pytest's
        # ast.parse builds the failure's report can run a nested ast.parse (a 3.11
        # traceback's carets), and CPython 3.11 then ends the whole run with
        # "SystemError: AST constructor recursion depth mismatch": collect it here first.
        gc.collect()
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and hasattr(item, "_gpulease_browser_contexts"):
        from tests.support.browser import save_screenshots

        for path in save_screenshots(item):
            report.sections.append(("screenshot", str(path)))
    if report.when == "call":
        item._gpulease_started = call.start
    if report.failed:
        from tests.support.hubproc import hub_tracebacks

        tracebacks = hub_tracebacks(getattr(item, "_gpulease_started", call.start) - 1)
        if tracebacks:
            report.sections.append(("tracebacks and 5xx answers in the hub's log", tracebacks))


@pytest.fixture
def no_cluster(monkeypatch):
    """kubespawner's spawner made where no cluster is: KubeSpawner loads a client
    configuration as it is made (none is loaded), and the client's default is a
    fresh one, not the one a cluster test left pointing at its gone control plane."""
    import kubespawner.spawner
    from kubernetes_asyncio.client import Configuration

    monkeypatch.setattr(kubespawner.spawner, "load_config", lambda **kw: None)
    monkeypatch.setattr(Configuration, "_default", None)
