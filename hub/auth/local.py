"""JupyterHub Authenticator for gpulease's local accounts (the embedded shape).

JupyterHub calls `authenticate(handler, data)` from two places:

- the login form (`LoginHandler.post`): `handler` is the LoginHandler and
  `data` the form fields, `username` stripped, `password` as typed;
- the token endpoint (`UserTokenListAPIHandler.post`, `POST
  /hub/api/users/{name}/tokens` without a token or cookie): `handler` is that
  API handler and `data` is the JSON body's `auth` value, which may be missing
  (None) or any JSON value at all.

Both handlers are tornado RequestHandlers. The address a login is counted
against is not `handler.request.remote_ip`: with `xheaders=True` tornado takes
that from the client's own X-Real-Ip / X-Forwarded-For. It is worked out from
the socket's peer and the X-Forwarded-For entries that trusted proxies
appended (gpulease.hub.auth.client_address).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyterhub.auth import Authenticator
from traitlets import (
    Bool,
    Float,
    Integer,
    List,
    TraitError,
    Unicode,
    default,
    observe,
    validate,
)

from gpulease.core.policy.user_names import is_valid_name
from gpulease.hub.auth.client_address import Network, login_address, parse_trusted
from gpulease.hub.auth.login_throttle import LoginThrottle
from gpulease.hub.auth.socket_owner import ProxyHosts, ProxyPeers, peer_and_local
from gpulease.store.accounts import HASH_PARALLELISM, MAX_NAME_LENGTH, LocalAccountStore
from gpulease.store.db import open_database

_stores: dict[str, LocalAccountStore] = {}
_stores_lock = threading.Lock()


def store_for(db_url: str) -> LocalAccountStore:
    """One store (and so one connection pool) per database URL in this process."""
    with _stores_lock:
        if db_url not in _stores:
            _stores[db_url] = LocalAccountStore(open_database(db_url))
        return _stores[db_url]


UNKNOWN_ADDRESS = "unknown"
# A try that could lock its name or address while tries ahead of it are being
# checked asks again this often, this many times, before it is refused: a few
# checks per try, so that thousands waiting cost the event loop little.
IN_FLIGHT_POLL_S = 0.2
IN_FLIGHT_POLLS = 5
# A browser that logged in as a name gets a cookie signed with the hub's
# cookie secret saying so: its later tries for that name are the owner's
# wherever they come from, after a hub restart too (the throttle's known
# addresses are in memory), and wait no turn while others guess the name.
KNOWN_COOKIE_DAYS = 30


def _known_cookie(name: str) -> str:
    return f"gpulease-known-{name}"  # valid names are [a-z0-9-]: a cookie name as they are


def has_known_cookie(handler: Any, name: str) -> bool:
    get = getattr(handler, "get_signed_cookie", None)
    if get is None or not is_valid_name(name):
        return False
    try:
        return get(_known_cookie(name), max_age_days=KNOWN_COOKIE_DAYS) == name.encode()
    except Exception:  # no cookie secret (not a hub handler), a malformed cookie
        return False


def set_known_cookie(handler: Any, name: str) -> None:
    set_cookie = getattr(handler, "set_signed_cookie", None)
    if set_cookie is None:
        return
    path = getattr(getattr(handler, "hub", None), "base_url", None) or "/"
    secure = getattr(getattr(handler, "request", None), "protocol", "") == "https"
    set_cookie(_known_cookie(name), name, expires_days=KNOWN_COOKIE_DAYS, path=path,
               httponly=True, secure=secure, samesite="Strict")


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_login_threads(cpus: int) -> int:
    """Password checks at once that leave three quarters of `cpus` to the rest."""
    return max(1, min(4, cpus // (4 * HASH_PARALLELISM)))


def _lower_priority(niceness: int) -> None:
    # Linux keeps a nice value per thread, and threads a thread starts (argon2's
    # lanes) inherit it; elsewhere setpriority would renice the whole hub.
    if niceness and sys.platform.startswith("linux"):
        thread = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, current + niceness))


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
        help="""Failed logins within `failure_window` seconds that lock a user
        name out from the client address they came from, or lock out a client
        address that tried several names. Failures for a name from other
        addresses never lock its owner out from where they have logged in
        before: they delay each try for that name from there by a second, and
        make tries from other addresses take turns (one check a second,
        doubling with each lockout of the name).""",
    ).tag(config=True)

    strangers_take_turns = Bool(
        True,
        help="""While a name is being guessed from elsewhere, tries for it from
        addresses and browsers it has never logged in from take turns: one
        password check a second for the name, doubling with each lockout of
        it, and a try whose turn is over 10 s away is refused unchecked. So
        many addresses guess a name no faster than one; its owner, from an
        address or browser they logged in from before, is only delayed by a
        second. False: every try from an address that has not failed itself is
        only delayed by a second and never refused, so an owner on a new
        machine is never refused either, and N addresses guess N at a time.""",
    ).tag(config=True)

    failure_window = Float(
        600,
        help="Seconds over which failed logins are counted towards a lockout.",
    ).tag(config=True)

    lockout_seconds = Float(
        60,
        help="""Length of the first lockout in seconds; each further lockout of
        the same name and address, or address, doubles it, up to
        `max_lockout_seconds`. While locked out even the right password is
        refused from that address.""",
    ).tag(config=True)

    max_lockout_seconds = Float(
        3600,
        help="Longest lockout in seconds.",
    ).tag(config=True)

    trusted_proxies = List(
        Unicode(),
        help="""Addresses or CIDR ranges of proxies in front of the hub's
        configurable-http-proxy (an Ingress, a load balancer, a TLS proxy)
        whose X-Forwarded-For entries are believed, e.g. ["10.0.0.0/24"].
        A login is counted against the address such a proxy saw; without it,
        against the proxy's own address. The hub's own configurable-http-proxy
        is always believed; X-Real-Ip never is. Listing loopback trusts every
        local process, users' servers included.""",
    ).tag(config=True)

    proxy_hosts = List(
        Unicode(),
        help="""Host names of the hub's own configurable-http-proxy where it runs
        apart from the hub (the Helm chart's proxy pod, behind a headless
        Service): a peer at an address one of them resolves to is the hub's
        proxy, whose X-Forwarded-For entry is believed, as for a proxy the hub
        started itself. Resolved again every 30 s.""",
    ).tag(config=True)

    login_threads = Integer(
        min=1,
        help="""Threads that check passwords (argon2 and the account lookup).
        Their own small pool, so that a flood of logins queues there instead
        of taking the threads the rest of the hub runs on. Each check keeps
        2 cores busy (argon2's lanes), so the default is the cores the hub
        may use divided by 8, between 1 and 4 (1 on up to 15 cores): three
        quarters of the machine stay with the hub, the proxy and the
        servers.""",
    ).tag(config=True)

    @default("login_threads")
    def _default_login_threads(self) -> int:
        return default_login_threads(usable_cpus())

    login_thread_niceness = Integer(
        10,
        min=0,
        max=19,
        help="""How much lower than the hub's the CPU priority of the password
        checking threads is (Linux nice, per thread; 0: the same). A flood of
        logins then takes the CPU the hub's event loop, the proxy and the
        gpulease service leave over, instead of slowing their answers.""",
    ).tag(config=True)

    @validate("trusted_proxies")
    def _valid_trusted_proxies(self, proposal: dict) -> list[str]:
        try:
            parse_trusted(proposal["value"])
        except ValueError as e:
            raise TraitError(f"LocalAccountsAuthenticator.{e}") from None
        return proposal["value"]

    @default("allow_all")
    def _default_allow_all(self) -> bool:
        # The local accounts are the allow list: admins create them, so every
        # account that can log in may use the hub. Restricting allow config
        # (allowed_users) given explicitly turns this off, as for JupyterHub's
        # own authenticators; allow_existing_users then follows JupyterHub's
        # default (on when allowed_users is set) and is moot while allow_all is on.
        return not self.allowed_users

    def validate_username(self, username: str) -> bool:
        # JupyterHub asks this of every name it makes or logs in (login, POST
        # /hub/api/users, a rename, admin_users, add_user at start): gpulease's
        # one rule (gpulease.core.policy.user_names) on top of JupyterHub's own checks.
        return super().validate_username(username) and is_valid_name(username)

    def normalize_username(self, username: str) -> str:
        # No silent lowercasing (JupyterHub's default): "Alice" is refused by
        # the rule, naming "alice", instead of becoming another name than the
        # one asked for. The login form's name is lowercased in authenticate.
        return self.username_map.get(username, username)

    # The clock for throttling; tests replace it. Monotonic, so that a wall
    # clock step cannot lift or extend a lockout.
    clock: Callable[[], float] = staticmethod(time.monotonic)
    # How delays are waited out; tests replace it along with the clock.
    sleep: Callable[[float], Awaitable[None]] = staticmethod(asyncio.sleep)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._store: LocalAccountStore | None = None
        self._throttle: LoginThrottle | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._proxy_peers = ProxyPeers(self.log)
        self._proxy_hosts: ProxyHosts | None = None

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

    @property
    def _proxy_hosts_checker(self) -> ProxyHosts:
        if self._proxy_hosts is None or self._proxy_hosts.hosts != tuple(self.proxy_hosts):
            self._proxy_hosts = ProxyHosts(self.proxy_hosts, log=self.log)
        return self._proxy_hosts

    @property
    def _trusted(self) -> tuple[Network, ...]:
        return parse_trusted(self.trusted_proxies)

    async def client_address(self, handler: Any) -> str:
        """The address this login is counted against (module docstring)."""
        request = getattr(handler, "request", None)
        peer, local = peer_and_local(request)
        if peer is None:
            return UNKNOWN_ADDRESS
        trusted = self._trusted
        headers = getattr(request, "headers", None)
        forwarded = headers.get("X-Forwarded-For") if headers is not None else None
        own_proxy = bool(forwarded) and (
            await self._proxy_peers.is_own_proxy(request, peer, local)
            or await self._proxy_hosts_checker.has(peer[0], self.clock()))
        return login_address(peer[0], forwarded, own_proxy, trusted)

    @property
    def login_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.login_threads, thread_name_prefix="gpulease-login",
                initializer=_lower_priority, initargs=(self.login_thread_niceness,),
            )
        return self._pool

    @observe("login_threads", "login_thread_niceness")
    def _login_threads_changed(self, _change: dict) -> None:
        # Also called while config is applied in __init__, before _pool exists.
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)
        self._pool = None

    async def authenticate(self, handler: Any, data: Any) -> str | None:
        address = await self.client_address(handler)
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

        known = not self.strangers_take_turns or has_known_cookie(handler, name)
        verdict = self.throttle.check(name, address, self.clock(), known)
        for _ in range(IN_FLIGHT_POLLS):
            if not verdict.wait:
                break
            await self.sleep(IN_FLIGHT_POLL_S)
            verdict = self.throttle.check(name, address, self.clock(), known)
        if verdict.wait:
            self.log.warning(
                "Login for user %r from %s refused unchecked: tries for it, or from there, "
                "that are still being checked could lock it out", shown, address,
            )  # fmt: skip
            await self.sleep(self.throttle.delay_s)
            return None
        if verdict.busy:
            self.log.warning(
                "Login for user %r from %s refused unchecked: the name is being guessed "
                "from elsewhere, and tries from addresses it has not logged in from take "
                "turns (the next in %.0f seconds)", shown, address, verdict.refuse_s,
            )  # fmt: skip
        elif verdict.refused:
            self.log.warning(
                "Login for user %r from %s refused: locked out for %.0f more seconds",
                shown, address, verdict.refuse_s,
            )  # fmt: skip
        if verdict.refused:
            await self.sleep(verdict.delay_s)  # held, so that refusals cannot be had fast
            return None
        try:
            # Other addresses are failing this name: slow the guessing (one
            # check at a time from addresses it has not logged in from), never
            # refuse the owner where they log in.
            if verdict.delay_s:
                await self.sleep(verdict.delay_s)
            ok = await self._verify(name, password)
        except BaseException:
            self.throttle.abandon(name, address)  # admitted, in flight: it ends here
            raise
        now = self.clock()
        if ok:
            self.throttle.success(name, address, now)
            set_known_cookie(handler, name)
            return name

        self.log.warning("Failed login for user %r from %s: wrong name or password", shown, address)
        started = self.throttle.failure(name, address, now)
        if started.lockout_s:
            self.log.warning(
                "Too many failed logins for user %r, or for several names, from %s: "
                "locked out for %.0f seconds from that address",
                shown, address, started.lockout_s,
            )  # fmt: skip
        if started.slowdown_s:
            self.log.warning(
                "Too many failed logins for user %r: for the next %.0f seconds its tries "
                "wait %.1f s, from addresses it has not logged in from one at a time",
                shown, started.slowdown_s, self.throttle.delay_s,
            )  # fmt: skip
        return None

    async def _verify(self, name: str, password: str) -> bool:
        # argon2 costs tens of milliseconds of CPU and the store queries the
        # database synchronously: both run off the hub's event loop, in a pool
        # of their own, so a flood of logins waits there rather than in the
        # default executor the rest of the hub (and JupyterHub) shares.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.login_pool, self._verify_sync, name, password)

    def _verify_sync(self, name: str, password: str) -> bool:
        return self.store.verify(name, password)
