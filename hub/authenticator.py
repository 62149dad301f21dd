"""JupyterHub Authenticator for gpulease's local accounts (the embedded shape).

JupyterHub calls `authenticate(handler, data)` from two places:

- the login form (`LoginHandler.post`): `handler` is the LoginHandler and
  `data` the form fields, `username` stripped, `password` as typed;
- the token endpoint (`UserTokenListAPIHandler.post`, `POST
  /hub/api/users/{name}/tokens` without a token or cookie): `handler` is that
  API handler and `data` is the JSON body's `auth` value, which may be missing
  (None) or any JSON value at all.

Both handlers are tornado RequestHandlers, so the client address is
`handler.request.remote_ip` (the hub runs tornado with `xheaders=True`, so
behind the proxy this is the address from X-Forwarded-For / X-Real-Ip).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from jupyterhub.auth import Authenticator
from traitlets import Float, Integer, Unicode, default, observe

from gpulease.hub.accounts import MAX_NAME_LENGTH, LocalAccountStore
from gpulease.hub.db import open_database
from gpulease.hub.login_throttle import LoginThrottle

_stores: dict[str, LocalAccountStore] = {}
_stores_lock = threading.Lock()


def store_for(db_url: str) -> LocalAccountStore:
    """One store (and so one connection pool) per database URL in this process."""
    with _stores_lock:
        if db_url not in _stores:
            _stores[db_url] = LocalAccountStore(open_database(db_url))
        return _stores[db_url]


def client_address(handler: Any) -> str | None:
    request = getattr(handler, "request", None)
    return getattr(request, "remote_ip", None)


def _loggable(name: str) -> str:
    # Names that fail validation can be anything a client sent; keep log lines short.
    return name if len(name) <= MAX_NAME_LENGTH else f"{name[:16]}...({len(name)} chars)"


class LocalAccountsAuthenticator(Authenticator):
    """Log in with a gpulease local account (name and password), with login throttling."""

    db_url = Unicode(
        "",
        help="""URL of gpulease's database, which holds the local accounts
        (e.g. sqlite:////srv/gpulease/gpulease.sqlite or postgresql://...).
        gpulease's hub configuration sets it.""",
    ).tag(config=True)

    max_failures = Integer(
        5,
        help="""Failed logins for one user name, or from one client address,
        within `failure_window` seconds that lock that name or address out.""",
    ).tag(config=True)

    failure_window = Float(
        600,
        help="Seconds over which failed logins are counted towards a lockout.",
    ).tag(config=True)

    lockout_seconds = Float(
        60,
        help="""Length of the first lockout in seconds; each further lockout of
        the same name or address doubles it, up to `max_lockout_seconds`.
        While locked out even the right password is refused.""",
    ).tag(config=True)

    max_lockout_seconds = Float(
        3600,
        help="Longest lockout in seconds.",
    ).tag(config=True)

    @default("allow_all")
    def _default_allow_all(self) -> bool:
        # The local accounts are the allow list: admins create them, so every
        # account that can log in may use the hub. Restricting allow config
        # (allowed_users) given explicitly turns this off, as for JupyterHub's
        # own authenticators; allow_existing_users then follows JupyterHub's
        # default (on when allowed_users is set) and is moot while allow_all is on.
        return not self.allowed_users

    # The clock for throttling; tests replace it. Monotonic, so that a wall
    # clock step cannot lift or extend a lockout.
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._store: LocalAccountStore | None = None
        self._throttle: LoginThrottle | None = None

    @property
    def store(self) -> LocalAccountStore:
        if self._store is None:
            if not self.db_url:
                raise RuntimeError("LocalAccountsAuthenticator.db_url is not set")
            self._store = store_for(self.db_url)
        return self._store

    @store.setter
    def store(self, store: LocalAccountStore) -> None:
        self._store = store

    @observe("db_url")
    def _db_url_changed(self, _change: dict) -> None:
        self._store = None

    @property
    def throttle(self) -> LoginThrottle:
        if self._throttle is None:
            self._throttle = LoginThrottle(
                max_failures=self.max_failures,
                window_s=self.failure_window,
                lockout_s=self.lockout_seconds,
                max_lockout_s=self.max_lockout_seconds,
            )
        return self._throttle

    @observe("max_failures", "failure_window", "lockout_seconds", "max_lockout_seconds")
    def _throttle_config_changed(self, _change: dict) -> None:
        self._throttle = None

    async def authenticate(self, handler: Any, data: Any) -> str | None:
        address = client_address(handler)
        if not isinstance(data, dict) or not isinstance(data.get("username"), str):
            # e.g. the token endpoint without an `auth` body: no login attempt to count.
            self.log.debug("No username given to authenticate from %s", address)
            return None
        name = data["username"].strip().lower()
        shown = _loggable(name)
        # Valid names are at most 32 characters; cutting longer (never valid)
        # ones keeps throttle keys small whatever a client sends.
        name = name[: 2 * MAX_NAME_LENGTH]
        password = data.get("password")
        if not isinstance(password, str):
            password = ""  # still verified, so that the work done stays the same

        wait = self.throttle.check(name, address, self.clock())
        if wait > 0:
            self.log.warning(
                "Login for user %r from %s refused: locked out for %.0f more seconds",
                shown, address, wait,
            )  # fmt: skip
            return None

        ok = await self._verify(name, password)
        now = self.clock()
        if ok:
            self.throttle.success(name, address, now)
            return name

        self.log.warning("Failed login for user %r from %s: wrong name or password", shown, address)
        started = self.throttle.failure(name, address, now)
        if started:
            self.log.warning(
                "Too many failed logins for user %r or from %s: locked out for %.0f seconds",
                shown, address, started,
            )  # fmt: skip
        return None

    async def _verify(self, name: str, password: str) -> bool:
        # argon2 costs tens of milliseconds of CPU and the store queries the
        # database synchronously: both run off the hub's event loop.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._verify_sync, name, password)

    def _verify_sync(self, name: str, password: str) -> bool:
        return self.store.verify(name, password)
