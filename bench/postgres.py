"""A PostgreSQL server for a benchmark: the one named, else a private cluster of its own.

A fresh machine runs no PostgreSQL, and one that does is not ours to write to:
without a URL (`--postgres`, or GPULEASE_TEST_POSTGRES_URL as `.ci/run` exports
it) the benchmark starts a throwaway cluster with scripts/private-postgres
(Debian's server binaries, loopback only, a free port; as root it belongs to
the `postgres` account) and stops it at the end, as the test suite does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRIVATE_POSTGRES = ROOT / "scripts" / "private-postgres"
ENV_URL = "GPULEASE_TEST_POSTGRES_URL"


class NoPostgres(RuntimeError):
    """No URL was given and no private cluster could be started."""


def server_binaries() -> bool:
    """Whether Debian's PostgreSQL server binaries are here (scripts/private-postgres)."""
    return any(Path("/usr/lib/postgresql").glob("*/bin/initdb"))


def given_url(cli_url: str | None) -> str | None:
    """The server named on the command line, else in the environment, else None."""
    return cli_url or os.environ.get(ENV_URL) or None


@contextmanager
def postgres_server(cli_url: str | None) -> Iterator[str]:
    """The URL of a PostgreSQL server where the benchmark may create and drop databases."""
    url = given_url(cli_url)
    if url:
        yield url
        return
    folder = Path(tempfile.mkdtemp(prefix="gpulease-bench-pg-"))
    folder.chmod(0o755)  # as root, the cluster's owner (postgres) works in it
    try:
        started = subprocess.run([str(PRIVATE_POSTGRES), "start", str(folder)],
                                 capture_output=True, text=True)
        if started.returncode != 0:
            raise NoPostgres(
                "no PostgreSQL for the benchmark: give --postgres URL (or set "
                f"{ENV_URL}), or install PostgreSQL's server binaries "
                "(apt-get install postgresql) so that one of its own can start: "
                + (started.stderr.strip() or f"exit {started.returncode}"))
        print(f"PostgreSQL of this run (private): {started.stdout.strip()}", flush=True)
        try:
            yield started.stdout.strip()
        finally:
            subprocess.run([str(PRIVATE_POSTGRES), "stop", str(folder)], capture_output=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
