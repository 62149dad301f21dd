"""A refusal as JupyterHub answers it: tornado's HTTPError with its status and message.

gpulease.core.refusal.Refusal is plain Python; this is its one conversion for
JupyterHub's handlers (a spawner's start, the hub's own handlers and pages).
"""

from __future__ import annotations

from tornado import web

from gpulease.core.refusal import Refusal


def http_error(refusal: Refusal) -> Exception:
    """The refusal as tornado's HTTPError, for JupyterHub, which answers with its status
    and message (a spawner's start, a hub handler)."""
    error = web.HTTPError(refusal.status, "%s", refusal.message)
    error.gpulease_refusal = refusal  # type: ignore[attr-defined]
    if refusal.headers:  # JupyterHub's API answers set them (Retry-After on a 429)
        error.headers = dict(refusal.headers)  # type: ignore[attr-defined]
    return error
