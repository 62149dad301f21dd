"""End to end: login throttling on the address the hub's proxy saw, as attacks.

A real `gpulease up` (JupyterHub + configurable-http-proxy). Clients connect
from distinct loopback addresses (all of 127.0.0.0/8 is this machine), and
send X-Real-Ip / X-Forwarded-For headers of their choosing, as an attacker
would. 127.0.0.7 plays an Ingress in front of the proxy (trusted_proxies).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.hubproc import HubOptions, HubProcess, password_of
from tests.support.isolation_env import hub_python

pytestmark = pytest.mark.e2e

WRONG = "wrong-pw-0000"
INGRESS = "127.0.0.7"
USER_CONFIG = f"""
c.LocalAccountsAuthenticator.max_failures = 3
c.LocalAccountsAuthenticator.lockout_seconds = 120
c.LocalAccountsAuthenticator.trusted_proxies = ["{INGRESS}"]
"""
NAMES = ["erin", "frank", "grace", "ivan", "kate"]


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(config=USER_CONFIG, users=NAMES)


def failed_from(hub: HubProcess, name: str, address: str) -> int:
    return hub.log().count(f"Failed login for user '{name}' from {address}:")


def test_fresh_forged_headers_per_try_still_count_against_the_real_address(hub):
    for i in range(3):
        headers = {"X-Real-Ip": f"203.0.113.{i}", "X-Forwarded-For": f"198.51.100.{i}"}
        assert hub.login_form("erin", WRONG, source="127.0.0.2", headers=headers) \
            .login_status == 403
    # Locked out from there, whatever it claims to be next, and for every name.
    fresh = {"X-Real-Ip": "203.0.113.200", "X-Forwarded-For": "198.51.100.200"}
    assert hub.login_form("erin", password_of("erin"), source="127.0.0.2", headers=fresh) \
        .login_status == 403
    assert hub.login_form("frank", password_of("frank"), source="127.0.0.2").login_status == 403
    # From another address the right password works (delayed at most a second).
    assert hub.login_form("erin", password_of("erin"), source="127.0.0.3").login_status == 302
    assert failed_from(hub, "erin", "127.0.0.2") == 3
    log = hub.log()
    assert "'erin' from 127.0.0.2 refused: locked out" in log
    assert "from 203.0.113." not in log and "from 198.51.100." not in log


def test_a_forged_header_cannot_lock_out_another_address(hub):
    forged = {"X-Forwarded-For": "127.0.0.5", "X-Real-Ip": "127.0.0.5"}
    for name in ["grace", "no-such-user", "nor-this-one"]:
        assert hub.login_form(name, WRONG, source="127.0.0.4", headers=forged) \
            .login_status == 403
    assert hub.login_form("grace", password_of("grace"), source="127.0.0.5").login_status == 302
    assert hub.login_form("frank", password_of("frank"), source="127.0.0.5").login_status == 302
    assert hub.login_form("frank", password_of("frank"), source="127.0.0.4").login_status == 403
    assert failed_from(hub, "grace", "127.0.0.4") == 1


def test_an_ingress_in_trusted_proxies_is_believed_for_the_client_it_saw(hub):
    # 127.0.0.7 is trusted: the X-Forwarded-For entry it appended is the client.
    via = {"X-Forwarded-For": "203.0.113.50"}
    for _ in range(3):
        assert hub.login_form("ivan", WRONG, source=INGRESS, headers=via).login_status == 403
    assert hub.login_form("ivan", password_of("ivan"), source=INGRESS, headers=via).login_status == 403
    other = {"X-Forwarded-For": "203.0.113.50, 203.0.113.51"}  # the client wrote the first
    assert hub.login_form("ivan", password_of("ivan"), source=INGRESS, headers=other).login_status == 302
    assert failed_from(hub, "ivan", "203.0.113.50") == 3


# Another account (as a user's server runs) posts straight to the hub's own
# port, claiming to be the proxy forwarding 127.0.0.8.
DIRECT = """
import http.client, json, sys
host, port, name, wrong = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
statuses = []
for _ in range(3):
    c = http.client.HTTPConnection(host, port, source_address=("127.0.0.9", 0), timeout=30)
    body = json.dumps({"auth": {"username": name, "password": wrong}})
    c.request("POST", f"/hub/api/users/{name}/tokens", body,
              {"Content-Type": "application/json", "X-Forwarded-For": "127.0.0.8",
               "X-Real-Ip": "127.0.0.8"})
    statuses.append(c.getresponse().status)
    c.close()
print(json.dumps(statuses))
"""


def test_a_local_account_going_around_the_proxy_cannot_pose_as_it(hub):
    if os.geteuid() != 0:
        pytest.skip("needs root, to connect as another account")
    python, why_not = hub_python()
    if why_not:
        pytest.skip(why_not)
    done = subprocess.run([python, "-I", "-S", "-c", DIRECT, hub.hub_host, str(hub.hub_port),
                           "kate", WRONG],
                          user=65534, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(status in (401, 403) for status in json.loads(done.stdout)), done.stdout
    # Counted against the socket it came from, not the address it claimed.
    assert hub.login_form("kate", password_of("kate"), source="127.0.0.8").login_status == 302
    assert failed_from(hub, "kate", "127.0.0.9") == 3
    assert failed_from(hub, "kate", "127.0.0.8") == 0
