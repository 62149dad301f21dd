"""End to end: a researcher's own config cannot run unbilled or outlive its credit.

A real hub (1-second heartbeat) and real JupyterLab servers, each shaped by a
`~/.jupyter/jupyter_server_config.py` written in the researcher's home before
the start — which is code the researcher controls:

- a config that sleeps most of `http_timeout` before the server answers: it
  must be billed from its launch, not its first answer (one that sleeps past
  it fails its start: tests/e2e/test_billing_from_launch.py);
- a config that holds the server's port without answering (the first probes
  time out: tornado's 599, not an OSError): the start must go on;
- a config that ignores SIGINT and SIGTERM: out of credit, the server must be
  gone within a couple of heartbeats (killed), its device released;
- a member of a group account reaching their monthly cap while running is
  stopped within a heartbeat (`account_cap`) and shown as suspended.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil
import pytest
from sqlalchemy import delete

from gpulease.store.db import open_database, sessions, sqlite_url
from tests.support.hubproc import HubOptions

pytestmark = pytest.mark.e2e

HEARTBEAT = 1.0
HTTP_TIMEOUT = 15

PROFILES = {"profiles": [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": "3.6", "min_run": "1m"},
    # one credit a second: a few credits run out within seconds
    {"slug": "pricey", "display_name": "A credit a second", "cpu": 1, "memory": "2Gi",
     "images": ["pytorch"], "price_per_hour": "3600", "min_run": "1s"},
    {"slug": "pricey-gpu", "display_name": "A slice at a credit a second",
     "gpu": {"model": "H200", "mig": "1g.18gb"}, "cpu": 1, "memory": "2Gi",
     "images": ["pytorch"], "price_per_hour": "3600", "min_run": "1s"},
]}

# Answers some seconds before http_timeout, counted from the process's own start (a
# loaded machine may take seconds to reach the config at all).
SLOW_S = HTTP_TIMEOUT - 9  # and JupyterLab its seconds more on a loaded machine
SLOW_CONFIG = f"""
import time, psutil
time.sleep(max(0.0, psutil.Process().create_time() + {SLOW_S} - time.time()))
"""

# Holds the port the hub gave this server, accepting nothing: the hub's probes
# connect and then time out (599) until it lets go and the real server binds.
HOLD_PORT_CONFIG = """
import os, socket, time, urllib.parse
url = urllib.parse.urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
held = socket.socket()
held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
held.bind((url.hostname, url.port))
held.listen(64)
time.sleep(6)
held.close()
"""

# Ignores SIGINT and SIGTERM, also the handlers Jupyter installs after the config.
IGNORE_SIGTERM_CONFIG = """
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
_real_signal = signal.signal

def _keep_ignoring(sig, handler):
    if sig in (signal.SIGINT, signal.SIGTERM):
        return signal.SIG_IGN
    return _real_signal(sig, handler)

signal.signal = _keep_ignoring
"""


# Answers every readiness probe 503: JupyterHub keeps the start pending (it
# waits for an answer below 500) while the server runs — and is billed.
NEVER_READY_CONFIG = """
from tornado import web
from jupyter_server.base import handlers

def _not_ready(self):
    raise web.HTTPError(503, "not ready yet")

handlers.APIVersionHandler.get = _not_ready
"""


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(profiles=PROFILES, args=[
        f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}", "--Spawner.poll_interval=1",
        f"--Spawner.http_timeout={HTTP_TIMEOUT}"])


def home_config(hub, name: str, text: str) -> None:
    """The researcher's own server config, in their home (handed to them at first start)."""
    jupyter = hub.state / "homes" / name / ".jupyter"
    jupyter.mkdir(parents=True, exist_ok=True)
    (jupyter / "jupyter_server_config.py").write_text(text)


def sessions_of(hub, token) -> list[dict]:
    r = hub.service("GET", "api/usage", token)
    assert r.status_code == 200, r.text
    return r.json()["sessions"]


def held_by(hub, admin, name: str) -> list[str]:
    inv = hub.service("GET", "api/inventory", admin).json()
    return [d["uuid"] for n in inv["nodes"] for g in n["gpus"] for d in g["devices"]
            if d["holder"] and d["holder"]["user"] == name]


def server_pid(hub, user: str) -> int:
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmd, env = proc.info["cmdline"] or [], proc.info["environ"] or {}
        except psutil.Error:
            continue
        if (any("gpulease-singleuser" in part for part in cmd)
                and env.get("JUPYTERHUB_USER") == user
                and str(hub.state) in env.get("HOME", "")):
            return proc.pid
    raise LookupError(f"no server process for {user}")


def start(hub, name: str, token: str, profile: str, **options) -> None:
    r = hub.api("POST", f"users/{name}/server", token,
                {"user_options": {"profile": profile, **options}})
    assert r.status_code in (201, 202), r.text


@dataclass
class SlowStart:
    """A server whose own config delays its first answer: asked for at `t0`, seen ready at
    `ready`."""

    name: str
    token: str
    t0: float = 0.0
    ready: float = 0.0


@pytest.fixture(scope="module")
def slow_starts(hub, admin):
    """The two tests' servers whose configs delay their first answer ("slow" past
    http_timeout, "held" behind a held port), started at once: their waits overlap."""
    configs = {"slow": SLOW_CONFIG, "held": HOLD_PORT_CONFIG}
    starts = {}
    for name, config in configs.items():
        starts[name] = SlowStart(name, hub.add_user(admin, name, "100"))
        home_config(hub, name, config)

    def run(s: SlowStart) -> None:
        s.t0 = time.monotonic()
        start(hub, s.name, s.token, "cpu")  # "held", today: the first 599 fails the start
        hub.wait_server_ready(s.name, s.token, timeout=3 * HTTP_TIMEOUT)
        s.ready = time.monotonic()

    with ThreadPoolExecutor(len(starts)) as pool:
        for done in [pool.submit(run, s) for s in starts.values()]:
            done.result()
    return starts


def test_a_server_that_answers_late_is_billed_from_its_launch(hub, slow_starts):
    s = slow_starts["slow"]
    token, t0, ready = s.token, s.t0, s.ready
    assert ready - t0 > SLOW_S, "the config did not delay the server"
    time.sleep(max(0.0, ready + 2 * HEARTBEAT + 1 - time.monotonic()))
    (session,) = sessions_of(hub, token)
    assert session["ended"] is None and session["profile"] == "cpu"
    assert hub.api("DELETE", "users/slow/server", token).status_code in (202, 204)
    hub.wait_server_stopped("slow", token)
    stopped = time.monotonic()
    (session,) = sessions_of(hub, token)
    assert session["end_reason"] == "user"
    # billed from its launch (just after it was asked for) to the stop: the seconds its
    # config worked before the first answer included
    assert stopped - t0 - 3 <= session["billed_seconds"] <= stopped - t0 + 1


def test_a_server_whose_first_probes_time_out_still_starts_and_is_billed(hub, slow_starts):
    token = slow_starts["held"].token
    (session,) = sessions_of(hub, token)
    assert session["ended"] is None
    assert hub.api("DELETE", "users/held/server", token).status_code in (202, 204)
    hub.wait_server_stopped("held", token)


def test_out_of_credit_kills_a_server_that_ignores_sigterm(hub, admin):
    credit = 3
    token = hub.add_user(admin, "stubborn", str(credit))
    home_config(hub, "stubborn", IGNORE_SIGTERM_CONFIG)
    start(hub, "stubborn", token, "pricey-gpu")
    hub.wait_server_ready("stubborn", token)
    ready = time.monotonic()
    assert held_by(hub, admin, "stubborn")
    pid = server_pid(hub, "stubborn")
    # Jupyter's own stop (SIGINT, 10 s, SIGTERM, 5 s, SIGKILL) would take 15 s:
    # the credit runs out after `credit` seconds, the next heartbeats stop, then kill.
    hub.wait_server_stopped("stubborn", token, timeout=60)
    stopped = time.monotonic()
    assert stopped - ready <= credit + 4 * HEARTBEAT + 4, hub.log()[-3000:]
    assert "its stop did not complete" in hub.log()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert held_by(hub, admin, "stubborn") == []
    (session,) = sessions_of(hub, token)
    assert session["end_reason"] == "out_of_credit"


def test_out_of_credit_stops_a_server_whose_start_is_still_pending(hub, admin):
    credit = 2
    token = hub.add_user(admin, "pending", str(credit))
    home_config(hub, "pending", NEVER_READY_CONFIG)
    # the start request may answer 202 (slow) or fail (its spawn cancelled)
    hub.api("POST", "users/pending/server", token, {"user_options": {"profile": "pricey"}})
    hub.wait_server_stopped("pending", token, timeout=3 * HTTP_TIMEOUT)
    (session,) = sessions_of(hub, token)
    assert session["end_reason"] == "out_of_credit"
    # stopped while pending, not when JupyterHub gave up on it (http_timeout later)
    assert session["billed_seconds"] <= credit + 2 * HEARTBEAT + 3, session
    assert "interrupting the pending spawn" in hub.log()


def test_a_member_reaching_their_cap_while_running_is_stopped_and_suspended(hub, admin):
    token = hub.add_user(admin, "capped", None)
    assert hub.api("POST", "groups/lab", admin).status_code in (201, 409)
    assert hub.api("POST", "groups/lab/users", admin, {"users": ["capped"]}).status_code == 200
    hub.grant(admin, "group:lab", "1000")
    cap = 3
    r = hub.service("PUT", "api/accounts/group:lab/caps/capped", admin, {"monthly": str(cap)})
    assert r.status_code in (200, 201), r.text
    start(hub, "capped", token, "pricey", account="group:lab")
    hub.wait_server_ready("capped", token)
    hub.wait_server_stopped("capped", token, timeout=30)  # today: it runs on, past the cap
    (session,) = sessions_of(hub, token)
    assert session["end_reason"] == "account_cap" and session["account"] == "group:lab"
    assert session["billed_seconds"] <= cap + 2 * HEARTBEAT + 2
    servers = hub.service("GET", "api/me/servers", token).json()["servers"]
    (mine,) = [s for s in servers if s["name"] == ""]
    assert mine["state"] == "suspended" and mine["reason"] == "account_cap"
    assert "group:lab" in mine["reason_text"]
    notices = hub.service("GET", "api/notices", token).json()["notices"]
    (notice,) = [n for n in notices if n["kind"] == "suspended"]
    assert "monthly cap" in notice["message"] and "3.000000" in notice["message"]
    # the group still has credit: only this member's cap stopped it
    r = hub.service("GET", "api/balance?account=group:lab", admin)
    assert r.status_code == 200, r.text


def test_metering_repairs_a_running_server_left_without_a_session(hub, admin):
    """After a hub restart, a server that runs with no open session (started
    unbilled, or its session lost) gets one at the first heartbeat, logged."""
    token = hub.add_user(admin, "gap", "100")
    start(hub, "gap", token, "cpu")
    hub.wait_server_ready("gap", token)
    hub.kill()
    # The session is gone while the server runs on (what an unbilled start left).
    engine = open_database(sqlite_url(hub.state / "private" / "gpulease.sqlite"))
    with engine.begin() as conn:
        conn.execute(delete(sessions).where(sessions.c.user_name == "gap"))
    engine.dispose()
    hub.start()
    token = hub.token_for("gap", "gap-pw-12345")
    deadline = time.monotonic() + 10 * HEARTBEAT
    while time.monotonic() < deadline and not sessions_of(hub, token):
        time.sleep(0.5)
    (session,) = sessions_of(hub, token)
    assert session["ended"] is None and session["profile"] == "cpu"
    assert "with no open billing session" in hub.log()
    assert hub.api("DELETE", "users/gap/server", token).status_code in (202, 204)
    hub.wait_server_stopped("gap", token)
    assert sessions_of(hub, token)[0]["end_reason"] == "user"

