"""End a gpulease process at once once its own cleanup is done.

Python's finalization of a process that imported JupyterHub, tornado,
SQLAlchemy and aiohttp takes 0.2-0.7 s (freeing every module, collecting
every cycle) and does nothing anyone sees: by then the hub has stopped its
services, servers and proxy and closed its database, and each service has
stopped serving. `gpulease up` is stopped at every restart, and a stopping
hub waits for each of its services in turn, so this is paid two or three
times over at each stop. What Python's exit still does that matters is done
here first: the atexit callbacks, and flushing the logs and standard streams.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys


def end_process(code: int = 0) -> None:
    """Run the atexit callbacks, flush, and leave with `code`, skipping finalization."""
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or a pipe no one reads
                pass
    finally:
        os._exit(code)
