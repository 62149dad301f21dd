"""LocalAccountsAuthenticator driven directly, with a fake request handler.

The real login form and token endpoint are exercised by the end-to-end tests
(tests/e2e/test_login_throttle.py for forged headers through the real proxy);
here `FakeRequestHandler` stands in for the tornado handler JupyterHub passes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from tornado.httputil import HTTPHeaders
from traitlets import TraitError

from gpulease.hub.auth import local as authenticator_module
from gpulease.hub.auth.local import (
    LocalAccountsAuthenticator,
    default_login_threads,
    usable_cpus,
)
from gpulease.hub.auth.login_throttle import MAX_DELAY_S
from gpulease.store.accounts import LocalAccountStore
from gpulease.store.db import sqlite_url

PASSWORD = "correct horse battery"
WRONG = "incorrect-mule-42"
IP = "198.51.100.7"
OTHER_IP = "203.0.113.5"
FORGED = "192.0.2.66"


class FakeRequestHandler:
    """Stands in for the tornado RequestHandler (LoginHandler or the token API handler).

    Shaped as tornado's: the socket's peer in `request.connection.context.address`,
    and `remote_ip` what xheaders made of a client's headers (here always forged).
    """

    def __init__(self, peer: str = IP, headers: dict[str, str] | None = None) -> None:
        context = SimpleNamespace(address=(peer, 40000))
        connection = SimpleNamespace(context=context, stream=SimpleNamespace(socket=None))
        self.request = SimpleNamespace(
            connection=connection, headers=HTTPHeaders(headers or {}), remote_ip=FORGED
        )


class FakeClock:
    """The throttle's clock, and its sleep: delays are recorded and pass at once."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def auth(engine, clock) -> LocalAccountsAuthenticator:
    store = LocalAccountStore(engine)
    store.create("alice", PASSWORD)
    authenticator = LocalAccountsAuthenticator(max_failures=3, lockout_seconds=60)
    authenticator.store = store
    authenticator.clock = clock
    authenticator.sleep = clock.sleep
    return authenticator


async def login(auth, username, password, ip=IP, headers=None):
    return await auth.authenticate(
        FakeRequestHandler(ip, headers), {"username": username, "password": password}
    )


async def test_right_password_logs_in(auth):
    assert await login(auth, "alice", PASSWORD) == "alice"
    assert await login(auth, " Alice ", PASSWORD) == "alice"  # normalised as JupyterHub would


async def test_wrong_password_and_unknown_user_refused(auth):
    assert await login(auth, "alice", WRONG) is None
    assert await login(auth, "mallory", PASSWORD) is None
    assert await login(auth, "not a valid name", PASSWORD) is None


async def test_full_jupyterhub_path_allows_account(auth):
    # get_authenticated_user is what both JupyterHub handlers call; with the
    # default allow_all the account alone is enough.
    assert auth.allow_all is True
    model = await auth.get_authenticated_user(
        FakeRequestHandler(), {"username": "alice", "password": PASSWORD}
    )
    assert model["name"] == "alice"
    wrong = {"username": "alice", "password": WRONG}
    assert await auth.get_authenticated_user(FakeRequestHandler(), wrong) is None


def test_allowed_users_turns_allow_all_off():
    assert LocalAccountsAuthenticator().allow_all is True
    assert LocalAccountsAuthenticator().any_allow_config is True  # no "nobody can log in" warning
    restricted = LocalAccountsAuthenticator(allowed_users={"alice"})
    assert restricted.allow_all is False
    assert restricted.check_allowed("alice") and not restricted.check_allowed("bob")
    assert LocalAccountsAuthenticator(allowed_users={"a"}, allow_all=True).allow_all is True


@pytest.mark.parametrize(
    "data",
    [None, "alice", {}, {"username": 5, "password": PASSWORD}, {"username": "alice"},
     {"username": "alice", "password": 12345678}],
)  # fmt: skip
async def test_token_endpoint_shaped_bodies_refused(auth, data):
    # The token endpoint passes its JSON body's `auth` value, whatever it is.
    assert await auth.authenticate(FakeRequestHandler(), data) is None


async def test_lockout_holds_back_right_password_from_there_until_it_passes(auth, clock):
    for _ in range(3):
        assert await login(auth, "alice", WRONG) is None
    assert clock.slept == []  # failures themselves are answered at once
    assert await login(auth, "alice", PASSWORD) is None
    assert clock.slept == [MAX_DELAY_S]  # a refusal is held a second first
    clock.now = 1059
    assert await login(auth, "alice", PASSWORD) is None
    clock.now = 1060
    assert await login(auth, "alice", PASSWORD) == "alice"


async def test_failures_from_one_address_only_delay_the_right_password_from_another(
    auth, clock
):
    for _ in range(3):
        assert await login(auth, "alice", WRONG) is None
    assert await login(auth, "alice", PASSWORD) is None  # locked out from IP
    clock.slept.clear()
    assert await login(auth, "alice", PASSWORD, ip=OTHER_IP) == "alice"
    assert clock.slept == [MAX_DELAY_S] and MAX_DELAY_S <= 1
    # The success does not end the slowdown (alice's owner logging in says nothing
    # about who guesses from IP): a login from a new address still waits its turn.
    assert await login(auth, "alice", PASSWORD, ip="192.0.2.200") == "alice"
    assert clock.slept == [MAX_DELAY_S, MAX_DELAY_S]
    assert await login(auth, "alice", PASSWORD) is None  # IP's lockout stands


async def test_the_delay_is_real_time_and_at_most_a_second(auth):
    auth.sleep = LocalAccountsAuthenticator.sleep  # asyncio's, as in the hub
    for _ in range(3):
        assert await login(auth, "alice", WRONG) is None
    started = time.monotonic()
    assert await login(auth, "alice", PASSWORD, ip=OTHER_IP) == "alice"
    waited = time.monotonic() - started
    assert MAX_DELAY_S <= waited < MAX_DELAY_S + 0.9  # the delay, then one argon2 verify


async def test_forwarded_headers_from_a_client_are_not_believed(auth, clock):
    # A fresh X-Real-Ip / X-Forwarded-For per try changes tornado's remote_ip,
    # not the address the failures count against: the socket's peer.
    for i in range(3):
        headers = {"X-Real-Ip": f"192.0.2.{i}", "X-Forwarded-For": f"198.18.0.{i}"}
        assert await login(auth, "alice", WRONG, headers=headers) is None
    headers = {"X-Real-Ip": OTHER_IP, "X-Forwarded-For": OTHER_IP}
    assert await login(auth, "alice", PASSWORD, headers=headers) is None
    assert await auth.client_address(FakeRequestHandler(IP, headers)) == IP


async def test_trusted_proxies_entries_are_believed_from_the_right(auth):
    auth.trusted_proxies = ["198.51.100.0/24", "10.1.0.0/16"]
    # Client-written entries left of the last untrusted one are ignored.
    handler = FakeRequestHandler(IP, {"X-Forwarded-For": "6.6.6.6, 203.0.113.9, 10.1.2.3",
                                      "X-Real-Ip": FORGED})
    assert await auth.client_address(handler) == "203.0.113.9"
    for _ in range(3):
        await login(auth, "alice", WRONG, headers={"X-Forwarded-For": "203.0.113.9"})
    assert await login(auth, "alice", PASSWORD, headers={"X-Forwarded-For": "203.0.113.9"}) is None
    assert await login(auth, "alice", PASSWORD, headers={"X-Forwarded-For": OTHER_IP}) == "alice"
    # An untrusted peer's header is nobody's business.
    assert await auth.client_address(FakeRequestHandler(OTHER_IP, {"X-Forwarded-For": "1.2.3.4"})) \
        == OTHER_IP


def test_bad_trusted_proxies_entry_is_named():
    with pytest.raises(TraitError, match="'10.0.0.0/33'.*CIDR"):
        LocalAccountsAuthenticator(trusted_proxies=["10.0.0.1", "10.0.0.0/33"])


async def test_second_lockout_is_longer(auth, clock):
    for _ in range(3):
        await login(auth, "alice", WRONG)
    clock.now += 60
    for _ in range(3):
        await login(auth, "alice", WRONG)
    clock.now += 60
    assert await login(auth, "alice", PASSWORD) is None  # 120 s this time
    clock.now += 60
    assert await login(auth, "alice", PASSWORD) == "alice"


async def test_address_lockout_covers_other_names(auth, clock):
    for name in ["bob", "carol", "dave"]:
        await login(auth, name, WRONG)
    assert await login(auth, "alice", PASSWORD) is None
    assert await login(auth, "alice", PASSWORD, ip=OTHER_IP) == "alice"


async def test_failures_logged_with_user_and_address_without_password(auth, caplog, clock):
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        await login(auth, "alice", WRONG)
    await login(auth, "alice", PASSWORD)
    await login(auth, "mallory", "mallory-secret-9", ip="192.0.2.44")
    failures = [r for r in caplog.records if r.levelno == logging.WARNING]
    messages = [r.getMessage() for r in failures]
    assert sum("Failed login for user 'alice' from 198.51.100.7" in m for m in messages) == 3
    assert any("locked out for 60 seconds" in m for m in messages)
    assert any("'alice' from 198.51.100.7 refused: locked out" in m for m in messages)
    assert any("Failed login for user 'mallory' from 192.0.2.44" in m for m in messages)
    for secret in (WRONG, PASSWORD, "mallory-secret-9"):
        assert secret not in caplog.text


async def test_verify_runs_off_the_event_loop(auth, monkeypatch):
    threads = []
    real = auth._verify_sync
    monkeypatch.setattr(
        auth, "_verify_sync", lambda n, p: threads.append(threading.get_ident()) or real(n, p)
    )
    assert await login(auth, "alice", PASSWORD) == "alice"
    assert threads and threads[0] != threading.get_ident()


async def test_a_flood_of_logins_leaves_the_default_executor_free(auth, monkeypatch):
    # Each check made slow (0.2 s), 40 at once: they wait in the login pool's
    # own two threads, while the default executor, which JupyterHub and the
    # rest of the hub share, answers at once.
    names = []

    def slow_verify(name: str, password: str) -> bool:
        names.append(threading.current_thread().name)
        time.sleep(0.2)
        return False

    monkeypatch.setattr(auth, "_verify_sync", slow_verify)
    auth.login_threads = 2
    threads_before = threading.active_count()
    flood = [asyncio.create_task(login(auth, f"user{i}", WRONG, ip=f"10.0.0.{i}"))
             for i in range(40)]
    await asyncio.sleep(0.05)
    assert threading.active_count() - threads_before <= auth.login_threads == 2
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    await loop.run_in_executor(None, time.sleep, 0)
    assert time.monotonic() - started < 0.15
    await asyncio.gather(*flood)
    assert len(names) == 40 and set(names) <= {"gpulease-login_0", "gpulease-login_1"}


async def test_store_created_lazily_from_db_url_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(authenticator_module, "_stores", {})
    url = sqlite_url(tmp_path / "gpulease.sqlite")
    first = LocalAccountsAuthenticator(db_url=url)
    assert authenticator_module._stores == {}  # nothing opened before it is needed
    first.store.create("alice", PASSWORD)
    second = LocalAccountsAuthenticator(db_url=url)
    assert second.store is first.store
    assert await login(second, "alice", PASSWORD) == "alice"
    second.store.engine.dispose()


def test_store_without_db_url_is_a_clear_error():
    with pytest.raises(RuntimeError, match="db_url"):
        _ = LocalAccountsAuthenticator().store


def test_config_traits_have_help():
    traits = LocalAccountsAuthenticator.class_traits(config=True)
    for name in ["db_url", "max_failures", "failure_window", "lockout_seconds",
                 "max_lockout_seconds", "trusted_proxies", "login_threads",
                 "login_thread_niceness"]:  # fmt: skip
        assert traits[name].help.strip(), name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_login_pool_follows_config_and_runs_at_lower_priority():
    auth = LocalAccountsAuthenticator(login_threads=3, login_thread_niceness=5)
    assert auth.login_pool._max_workers == 3
    ours = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    theirs = auth.login_pool.submit(
        lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result()
    assert theirs == min(19, ours + 5)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == ours  # not the hub's
    auth.login_threads = 1
    assert auth.login_pool._max_workers == 1


def test_default_login_threads_leave_most_cores_to_the_hub():
    # Each check keeps HASH_PARALLELISM (2) cores busy.
    assert [default_login_threads(c) for c in (1, 2, 8, 15, 16, 24, 32, 256)] == [
        1, 1, 1, 1, 2, 3, 4, 4]
    assert LocalAccountsAuthenticator().login_threads == default_login_threads(usable_cpus())


def test_throttle_follows_config():
    auth = LocalAccountsAuthenticator(
        max_failures=7, failure_window=30, lockout_seconds=5, max_lockout_seconds=50
    )
    t = auth.throttle
    assert (t.max_failures, t.window_s, t.lockout_s, t.max_lockout_s) == (7, 30, 5, 50)


@pytest.mark.parametrize("take_turns", [True, False])
async def test_strangers_take_turns_or_are_only_delayed(auth, clock, take_turns):
    # alice is guessed from IP (locked out there), and 15 other new addresses
    # have taken the name's next turns: a try from yet another new address is
    # refused unchecked while turns are on, and only delayed a second when off.
    auth.strangers_take_turns = take_turns
    for _ in range(3):
        assert await login(auth, "alice", WRONG) is None
    for i in range(15):
        auth.throttle.check("alice", f"192.0.2.{i + 100}", clock.now)
    clock.slept.clear()
    result = await login(auth, "alice", PASSWORD, ip="198.18.0.1")
    if take_turns:
        assert result is None
    else:
        assert result == "alice" and clock.slept == [MAX_DELAY_S]


async def test_the_hubs_proxy_in_a_pod_of_its_own_is_known_by_its_host_name(auth):
    """The Helm chart's proxy runs in its own pod, found by a headless Service's name
    (proxy_hosts): its X-Forwarded-For entry is what a login counts against, and
    nobody else's is."""
    forwarded = {"X-Forwarded-For": "6.6.6.6, 203.0.113.9"}
    proxy_pod = FakeRequestHandler("127.0.0.1", forwarded)  # "localhost" resolves here
    assert await auth.client_address(proxy_pod) == "127.0.0.1"  # not known as the proxy
    auth.proxy_hosts = ["localhost"]
    assert await auth.client_address(proxy_pod) == "203.0.113.9"
    assert await auth.client_address(FakeRequestHandler(IP, forwarded)) == IP  # a server
    for _ in range(3):  # the stranger's failures count against their own address
        await login(auth, "alice", WRONG, ip="127.0.0.1", headers=forwarded)
    assert await login(auth, "alice", PASSWORD, ip="127.0.0.1",
                       headers={"X-Forwarded-For": OTHER_IP}) == "alice"
    auth.proxy_hosts = ["no-such-proxy.invalid"]  # unresolvable: believed for nobody
    assert await auth.client_address(proxy_pod) == "127.0.0.1"
