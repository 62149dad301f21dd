"""End to end: a server that exits on its own between heartbeats is billed to its exit.

A researcher's `~/.jupyter/jupyter_server_config.py` is their code. This one lets
the server answer, works for a few seconds, notes the moment and ends the process
(os._exit), well before the next heartbeat. Billing was closed at the last
heartbeat that saw it alive, so everything it did since (up to a heartbeat
interval, every time it is started again) ran unbilled; it must be billed to the
moment it ended, not later (nothing invented), and its session closed then.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from tests.support.hubproc import HubOptions

pytestmark = pytest.mark.e2e

HEARTBEAT = 10.0  # long, so that the server's whole life falls between two
WORK_S = 4.0

PROFILES = {"profiles": [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": "3600", "min_run": "1s"},
]}

# Waits for the server's own first answer, "works" WORK_S seconds, then ends.
EXITS_CONFIG = f"""
import json, os, threading, time, urllib.error, urllib.request
url = os.environ["JUPYTERHUB_SERVICE_URL"].rstrip("/") + "/api"

def _work_then_exit():
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.01)
    answered = time.time()
    time.sleep({WORK_S})
    with open(os.path.expanduser("~/exited.json"), "w") as f:
        json.dump({{"answered": answered, "exited": time.time()}}, f)
    os._exit(3)

threading.Thread(target=_work_then_exit, daemon=True).start()
"""


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(profiles=PROFILES, args=[
        f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}", "--Spawner.poll_interval=60"])


def epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_server_that_exits_between_heartbeats_is_billed_to_its_exit(hub):
    admin = hub.admin_token
    token = hub.add_user(admin, "quitter", "100")
    jupyter = hub.state / "homes" / "quitter" / ".jupyter"
    jupyter.mkdir(parents=True, exist_ok=True)
    (jupyter / "jupyter_server_config.py").write_text(EXITS_CONFIG)
    r = hub.api("POST", "users/quitter/server", token, {"user_options": {"profile": "cpu"}})
    assert r.status_code in (201, 202), r.text
    marks = hub.state / "homes" / "quitter" / "exited.json"
    deadline = time.monotonic() + 60 + 2 * HEARTBEAT
    session = None
    while time.monotonic() < deadline:
        found = hub.service("GET", "api/usage", token).json()["sessions"]
        if found and found[0]["ended"] is not None and marks.exists():
            # One session: none opened again for the server gone (it was: one a
            # heartbeat, each from its first answer, until JupyterHub's own poll)
            assert len(found) == 1, json.dumps(found, indent=1)
            (session,) = found
            break
        time.sleep(0.2)
    assert session is not None, f"no closed session:\n{hub.log()[-3000:]}"
    seen = json.loads(marks.read_text())
    started, ended = epoch(session["started"]), epoch(session["ended"])
    assert session["end_reason"] == "server_died"
    assert started <= seen["answered"]  # opened at its launch, before it answered
    ran_ms = (seen["exited"] - started) * 1000
    # Billed for all it ran (today: to the last heartbeat that saw it, maybe none)...
    assert session["billed_ms"] >= ran_ms - 200, (session, seen)
    # ...and no more: closed when it ended, not when the next heartbeat noticed.
    assert session["billed_ms"] <= ran_ms + 200 and ended <= seen["exited"] + 0.5, (session, seen)
