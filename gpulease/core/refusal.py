"""Refusal: the one type of everything gpulease refuses to a request.

A refusal carries the HTTP status to answer with, a message that names what
was wrong and what is allowed, and the fields it is about. The model and
billing core raise it (or one of its kinds below); it is turned into an
answer in one place per surface: the gpulease service's handlers render its
`body()` as JSON (hub/service/base.py), its pages as a page
(hub/service/pages/usage.py), and a spawner or a hub handler hands it to JupyterHub
as tornado's HTTP error (spawners/http_error.py, the spawners' `refuse`).
Nothing converts it by hand.

The kinds (OptionsRefused, LimitError, BillingError, ...) keep the
constructors their modules use and say where a refusal comes from; they add
no fields. It imports no web framework and no spawner: the core stays free
of both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple


class FieldError(NamedTuple):
    """One problem with one field of a request: `field` "" when it is the whole request.

    A (field, message) pair, so it unpacks as one: `for field, message in e.errors`."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


def field_errors(errors: Iterable[FieldError | tuple[str, str] | Mapping[str, Any]]
                 ) -> list[FieldError]:
    """FieldErrors from FieldErrors, (field, message) pairs or {"field", "message"} dicts."""
    out: list[FieldError] = []
    for error in errors:
        if isinstance(error, FieldError):
            out.append(error)
        elif isinstance(error, Mapping):
            out.append(FieldError(str(error.get("field", "")), str(error.get("message", ""))))
        else:
            field, message = error
            out.append(FieldError(field, message))
    return out


class Refusal(Exception):
    """A request refused: `status`, `message` and the `errors` per field (FieldError).

    `headers` go with the answer (Retry-After on a 429, say).
    """

    status: int = 400

    def __init__(self, message: str,
                 errors: Iterable[FieldError | tuple[str, str] | Mapping[str, Any]] = (), *,
                 status: int | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.errors = field_errors(errors)
        if status is not None:
            self.status = status
        self.headers = dict(headers or {})

    @classmethod
    def of_field(cls, field: str, message: str, status: int | None = None) -> Refusal:
        """A refusal about one field, whose message is the request's message too."""
        return Refusal(message, [FieldError(field, message)], status=status)

    def __str__(self) -> str:
        return self.message

    @property
    def field(self) -> str:
        """The field of its first error ("" when it names none)."""
        return self.errors[0].field if self.errors else ""

    def body(self) -> dict[str, Any]:
        """The JSON answer: {"status", "message", "errors": [{"field", "message"}]}."""
        return {"status": self.status, "message": self.message,
                "errors": [e.as_dict() for e in self.errors]}

    def under(self, prefix: str, whole: str = "") -> Refusal:
        """The same refusal with each field named under `prefix` ("user_options.gpu");
        a field equal to `whole` (the object itself) keeps its name."""
        errors = [FieldError(e.field if e.field == whole else f"{prefix}.{e.field}", e.message)
                  for e in self.errors]
        return Refusal(self.message, errors, status=self.status, headers=self.headers)

