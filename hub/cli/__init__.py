"""The `gpulease` command: `up` runs the embedded hub; the rest talk to a hub's REST API.

commands.py parses and dispatches; one module per command group (billing, cluster, limits,
reservations) and client.py, the client of the hub's and the service's APIs.
Importing this package imports none of them: `main` does, when the command runs.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The console script's entry point (`gpulease.hub.cli:main`)."""
    from gpulease.hub.cli.commands import main as run

    return run(argv)
