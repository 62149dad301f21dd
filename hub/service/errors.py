"""APIError: a Refusal made by the service's handlers themselves (gpulease/core/refusal.py).

The handlers render every Refusal the same way (BaseAPIHandler.write_error):
{"status", "message", "errors": [{field, message}]}.
"""

from __future__ import annotations

from gpulease.core.refusal import Refusal


class APIError(Refusal):
    def __init__(self, status: int, message: str, errors: list[dict[str, str]] | None = None,
                 headers: dict[str, str] | None = None):
        # headers are sent with the error (tornado clears headers set before it): Retry-After
        super().__init__(message, errors or (), status=status, headers=headers)
