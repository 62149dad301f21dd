"""The gpulease API's error body: {"status", "message", "errors": [{field, message}]}."""

from __future__ import annotations

from tornado import web


class APIError(web.HTTPError):
    def __init__(self, status: int, message: str, errors: list[dict[str, str]] | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(status, "%s", message)
        self.message = message
        self.errors = errors or []
        # Sent with the error (tornado clears headers set before it), e.g. Retry-After.
        self.headers = headers or {}
