"""The tests' HTTP clients keep cookies as browsers do for `Domain=localhost`.

Under a subdomain host JupyterHub sets its session-id cookie with `Domain=<the hub's
domain>` (shared with users' subdomains, by its design). For `make run`'s domain,
`localhost`, browsers follow RFC 6265 5.3 step 5: a Domain that is a public suffix
equal to the request's host makes a host-only cookie. Python's cookiejar instead
drops it (no embedded dot), so a requests session logged in to the hub lost its
session id, JupyterHub gave every request a new one, and a form's _xsrf never
matched. `install()` (tests/conftest.py) makes the stdlib policy do what browsers do,
for this one case only: a cookie for a dotless domain equal to the host it came from.
"""

from __future__ import annotations

from http.cookiejar import DefaultCookiePolicy, eff_request_host


def _as_browsers_do(set_ok):
    def set_ok_host_only(self, cookie, request):
        domain = cookie.domain.lstrip(".")
        host, effective = eff_request_host(request)
        if cookie.domain_specified and "." not in domain and domain == host.split(":")[0]:
            cookie.domain, cookie.domain_specified = effective, False
            cookie.domain_initial_dot = False
        return set_ok(self, cookie, request)

    set_ok_host_only.browser_like = True
    return set_ok_host_only


def install() -> None:
    if not getattr(DefaultCookiePolicy.set_ok, "browser_like", False):
        DefaultCookiePolicy.set_ok = _as_browsers_do(DefaultCookiePolicy.set_ok)
