"""End to end (embedded shape): starts that try to hold a device unbilled or uncounted.

Each played on a real hub with a researcher's own config, as
tests/e2e/test_billing_from_launch.py does (the attack review of billing from the
launch found them; each failed before its fix):

- a config that answers every request 503 and ignores SIGINT and SIGTERM: gpulease's
  probe took any byte as an answer, so the start "succeeded", JupyterHub waited its
  own http_timeout and stopped it the slow way, closed `user` and never counted. A
  5xx is no answer now (as for JupyterHub), so it is killed at http_timeout,
  start_failed, counted;
- a config that answers gpulease's probe below 500 but JupyterHub's own check 503
  (told apart by its User-Agent): JupyterHub's failed wait stops it; that stop is a
  failed start too, killed at once, start_failed, counted;
- DELETE api/failed-starts/NAME with a name outside the user-name rule, or a profile
  that is no slug: refused 400 naming it, nothing written to the audit log;
- on a host without cgroup limits, a researcher's DELETE of their own pending start
  is billed to when its process ended (it was closed at its launch: 0 ms), its
  process killed at once;

and one statement of the docs that was false (docs/security.md on the pod's grace).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.test_billing_from_launch import (
    MARK,
    closed_session,
    configure,
    epoch,
    marks,
    profile_hub,
    start,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PW = "admin-secret-pw"
HTTP_TIMEOUT_S = 6
LIMIT = 2

PROFILES = {"profiles": [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": "3600", "min_run": "1s"},
]}

# Binds the server's own port before jupyter_server does and answers every request
# "503" (a byte for gpulease's probe, a 5xx that JupyterHub's check retries), then
# never lets the server start, ignoring SIGINT and SIGTERM.
ANSWERS_ONLY_THE_PROBE = MARK + """
import signal as _s, socket as _so, threading as _th, urllib.parse as _up
for _n in (_s.SIGINT, _s.SIGTERM):
    _s.signal(_n, _s.SIG_IGN)
_u = _up.urlsplit(_o.environ["JUPYTERHUB_SERVICE_URL"])
_l = _so.socket()
_l.setsockopt(_so.SOL_SOCKET, _so.SO_REUSEADDR, 1)
_l.bind((_u.hostname or "", _u.port))
_l.listen(64)
def _serve():
    while True:
        _c, _a = _l.accept()
        try:
            _c.settimeout(2)
            _c.recv(65536)
            _c.sendall(b"HTTP/1.1 503 Service Unavailable\\r\\nContent-Length: 0\\r\\n"
                       b"Connection: close\\r\\n\\r\\n")
        except OSError:
            pass
        finally:
            _c.close()
_th.Thread(target=_serve, daemon=True).start()
_note(event="listening")
while True:
    _t.sleep(1)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from profile_hub(
        tmp_path_factory, "attacks", PROFILES, f"--Spawner.http_timeout={HTTP_TIMEOUT_S}",
        f"--GPULeaseHub.failed_start_limit={LIMIT}", "--GPULeaseHub.failed_start_window=10m")


@pytest.fixture(scope="module")
def admin(hub):
    return hub.token_for("admin", PW)


def test_a_server_that_answers_only_5xx_is_a_failed_start(hub, admin):
    """Its own code failed the start (no answer anyone accepts): killed at http_timeout,
    closed start_failed and counted, as a server that answers nothing is."""
    token = hub.add_user(admin, "prober", "100")
    configure(hub, "prober", ANSWERS_ONLY_THE_PROBE)
    r = start(hub, "prober", token)
    assert r.status_code < 600, r.text
    session = closed_session(hub, token, 1, timeout=HTTP_TIMEOUT_S + 90)
    seen = {m["event"] for m in marks(hub, "prober")}
    assert "listening" in seen, (seen, hub.log()[-3000:])
    counted = hub.service("GET", "api/failed-starts", token).json()["failed_starts"]
    problems = []
    if session["end_reason"] != "start_failed":
        problems.append(f"closed {session['end_reason']!r}, not 'start_failed'")
    if len(counted) != 1:
        problems.append(f"{len(counted)} failed starts counted, not 1")
    # killed at http_timeout (a second or two after its launch, it "answered")
    if session["billed_ms"] > (HTTP_TIMEOUT_S + 5) * 1000:
        problems.append(f"held {session['billed_ms']} ms: not killed at http_timeout "
                        f"({HTTP_TIMEOUT_S} s) but after JupyterHub's stop's waits")
    assert not problems, f"{problems}; session {session}"
    hub.wait_server_stopped("prober", token)


@pytest.mark.parametrize("name", ["Not A User!", "a" * 300])
def test_clearing_the_failed_starts_of_a_name_outside_the_rule_is_refused_naming_it(
        hub, admin, name):
    r = hub.service("DELETE", f"api/failed-starts/{name}", admin)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert "user name" in r.json()["message"], r.text[:300]
    audit = hub.service("GET", "api/audit", admin).json()
    assert not any(e["target"] == f"user:{name}" for e in audit["entries"]), \
        "an audit entry for a user that cannot exist"


def test_security_doc_gives_the_grace_the_cluster_shape_really_uses():
    """docs/security.md says a start that does not answer has its pod killed with no
    grace period; spawners/kube/spawner.py deletes it with KILL_GRACE_S (1 s), as
    docs/admin.md and docs/cluster.md say."""
    from gpulease.spawners.kube.spawner import KILL_GRACE_S

    text = " ".join((ROOT / "docs" / "security.md").read_text().split())
    if KILL_GRACE_S != 0:
        assert "a pod with no grace period" not in text


def _wait(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False



# Works WORK_S seconds' worth of ticks (a mark every 0.2 s) and never answers,
# ignoring SIGINT and SIGTERM: a researcher then stops the pending start.
TICKS_AND_NEVER_ANSWERS = MARK + """
import signal as _s
for _n in (_s.SIGINT, _s.SIGTERM):
    _s.signal(_n, _s.SIG_IGN)
while True:
    _note(event="tick")
    _t.sleep(0.2)
"""


@pytest.fixture(scope="module")
def nolimits_hub(tmp_path_factory):
    """A host without cgroup limits (docs/security.md, "No limits": a container without a
    writable cgroup hierarchy), per-user accounts on; JupyterHub's stop waits shortened
    (10 s + 5 s) to keep the test short."""
    yield from profile_hub(
        tmp_path_factory, "attacks-nolimits", PROFILES, "--Spawner.http_timeout=40",
        "--GPULeaseHub.resource_limits=none", "--GPULeaseHub.heartbeat_interval=30",
        "--Spawner.interrupt_timeout=10", "--Spawner.term_timeout=5")


def test_stopping_a_pending_start_bills_it_to_its_end_without_cgroups(nolimits_hub):
    """A researcher's DELETE of their own pending start (launched, not answered) cancels
    the start. Without a cgroup to empty, its session was closed at its last_alive (its
    launch: billed 0 ms) while the process ran on through JupyterHub's stop, its devices
    given back first: a free GPU loop of start, work, DELETE. The start's failure path
    now kills what was launched and bills it to its end."""
    hub = nolimits_hub
    admin = hub.token_for("admin", PW)
    token = hub.add_user(admin, "canceller", "100")
    configure(hub, "canceller", TICKS_AND_NEVER_ANSWERS)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(start, hub, "canceller", token)
        assert _wait(lambda: len([m for m in marks(hub, "canceller")
                                  if m["event"] == "tick"]) >= 40, 60), hub.log()[-3000:]
        r = hub.api("DELETE", "users/canceller/server", token)
        assert r.status_code in (202, 204), r.text
    session = closed_session(hub, token, 1, timeout=90)
    hub.wait_server_stopped("canceller", token, timeout=90)
    ticks = [m["at"] for m in marks(hub, "canceller") if m["event"] == "tick"]
    ran_s = max(ticks) - epoch(session["started"])
    assert session["billed_ms"] >= ran_s * 1000 - 300, (
        f"billed {session['billed_ms']} ms of the {ran_s:.1f} s its code ran; {session}")


# Answers gpulease's probe (no User-Agent) 404, JupyterHub's own check (tornado's
# client, "Tornado/..." User-Agent) 503: ready for one, never for the other.
TELLS_THE_CHECKS_APART = ANSWERS_ONLY_THE_PROBE.replace(
    '''            _c.recv(65536)
            _c.sendall(b"HTTP/1.1 503 Service Unavailable''', '''            _q = _c.recv(65536)
            _c.sendall((b"HTTP/1.1 404 Not Found" if b"user-agent" not in _q.lower() else
                        b"HTTP/1.1 503 Service Unavailable") + b"''')


def test_a_server_that_answers_only_gpuleases_probe_is_a_failed_start(hub, admin):
    """JupyterHub's own wait fails after http_timeout and it stops the server: that is
    the server's own doing, so the stop kills it at once (not SIGINT's and SIGTERM's
    waits), closes it start_failed and counts it."""
    assert TELLS_THE_CHECKS_APART != ANSWERS_ONLY_THE_PROBE
    token = hub.add_user(admin, "twofaced", "100")
    configure(hub, "twofaced", TELLS_THE_CHECKS_APART)
    asked = time.monotonic()
    r = start(hub, "twofaced", token)
    assert r.status_code < 600, r.text
    session = closed_session(hub, token, 1, timeout=HTTP_TIMEOUT_S + 90)
    took = time.monotonic() - asked
    assert session["end_reason"] == "start_failed", session
    # gpulease's wait, then JupyterHub's own http_timeout, then a kill: no stop's waits
    assert took < 2 * HTTP_TIMEOUT_S + 10, took
    counted = hub.service("GET", "api/failed-starts", token).json()["failed_starts"]
    assert len(counted) == 1 and "JupyterHub's own check" in counted[0]["why"], counted
    hub.wait_server_stopped("twofaced", token)


def test_a_profile_that_is_no_slug_is_refused_naming_it(hub, admin):
    r = hub.service("DELETE", "api/failed-starts/ada?profile=Not%20A%20Slug", admin)
    assert r.status_code == 400 and "profile" in r.json()["message"], r.text
