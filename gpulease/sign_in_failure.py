"""What a browser's failed sign-in tells the researcher, wherever it failed.

JupyterHub's OAuth ends at a callback: a server's `/oauth_callback`
(singleuser/error_page.py) and the gpulease service's (hub/service/pages/usage.py).
Either fails the same ways: a `state` that is stale, replayed or from another
browser (a 4xx), or a code the hub refuses or cannot confirm (a 5xx). One
wording for both, so a researcher reads the same advice on either page. It
never names the exception: that text can hold the hub's API URL or echo the
callback's `error_description`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SignInFailure:
    headline: str  # what went wrong
    cause: str  # why, in plain words
    advice: str  # what to do


def sign_in_failure(status: int, *, to: str = "", reopen: str = "the page") -> SignInFailure:
    """The wording for a sign-in `to` something (" to this server", or "" for a page)
    that ended with `status`; `reopen` names what to open again from the home page."""
    headline = f"Your sign-in{to} did not complete"
    if status >= 500:
        return SignInFailure(
            headline,
            "The hub did not confirm it: it refused the sign-in's code, or did not answer.",
            f"Wait a moment, then open {reopen} again from the home page. If this keeps "
            "happening, log out of the hub and log in again, or tell your hub's admins.")
    return SignInFailure(
        headline,
        "The sign-in link was out of date, already used, or opened in another browser.",
        f"Open {reopen} again from the home page. If this keeps happening, log out of the "
        "hub and log in again.")
