"""What an error page tells a researcher: what went wrong, in plain words, and what to do.

One wording per status for the hub's pages (templates/error.html, which
JupyterHub also renders for the proxy's error target, `/hub/error/NNN`) and
the gpulease service's (service/pages/usage.py). Each page adds its own detail and
a link to the hub's home page.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus


@dataclass(frozen=True)
class ErrorText:
    title: str  # what went wrong
    advice: str  # what to do
    phrase: str  # HTTP's own name for the status ("Not Found")


_AGAIN_LATER = ("Try again in a minute. If it keeps happening, tell your hub's admins "
                "when it happened.")
_TEXTS = {
    400: ("The request was not understood",
          "Go back, reload the page and try again."),
    401: ("You are not logged in", "Log in again, then open the page again."),
    403: ("You may not open this page",
          "If you should be able to, log out and log in again; otherwise ask your hub's "
          "admins for access."),
    404: ("There is no page at this address",
          "The link may be mistyped or out of date, or name a server that does not exist. "
          "Start again from the home page."),
    409: ("Something changed in the meantime", "Reload the page and try again."),
    429: ("Too many requests in a short time", "Wait a minute, then try again."),
    500: ("Something went wrong on our side", _AGAIN_LATER),
    502: ("A part of the service did not answer", _AGAIN_LATER),
    503: ("This is not available right now",
          "If it is your server, it may have stopped, been suspended while idle, or still "
          "be starting: start or resume it from the home page. Otherwise try again in a "
          "minute."),
    504: ("A part of the service did not answer in time", _AGAIN_LATER),
}
_OTHER_REQUEST_ERROR = ("The request could not be served",
                        "Go back and try again, or start again from the home page.")
_OTHER_SERVER_ERROR = _TEXTS[500]


def error_text(status: int) -> ErrorText:
    title, advice = _TEXTS.get(status) or (
        _OTHER_SERVER_ERROR if status >= 500 else _OTHER_REQUEST_ERROR)
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return ErrorText(title, advice, phrase)
