"""End to end (embedded shape): a server is billed from its launch, not its first answer.

A researcher's code runs from the server's launch: their
`~/.jupyter/jupyter_server_config.py` is loaded before the server answers. Each
test plays one such config on a real hub (warm starts, as shipped, and one cold):

- a config that works WORK_S seconds, then lets the server answer, is billed from
  the launch (at or before the config's first line ran), so for at least WORK_S,
  and shows "billed since" while it starts;
- a config that starts a worker, never lets the server answer and ignores SIGINT
  and SIGTERM is killed whole at `http_timeout`: the start fails naming why, its
  session closes as start_failed when the last of it ended, billed for what ran,
  and the worker does not outlive it;
- a config that exits at once fails its start too, billed for what ran;
- the failed starts are rationed per user and profile: past failed_start_limit
  in the window the next start is refused with 429 and Retry-After, naming why
  (other profiles start); a refusal before the launch is not counted; an admin's
  clear lets the user start again, and both are in the audit log.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from tests.support.hubproc import HubProcess

pytestmark = pytest.mark.e2e

PW = "admin-secret-pw"
HTTP_TIMEOUT_S = 15  # a JupyterLab on a loaded machine answers within it; a hang does not
WORK_S = 4.0
LIMIT = 2

PROFILES = {"profiles": [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": "3600", "min_run": "1s"},
    {"slug": "cpu-b", "display_name": "CPU B", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": "3600", "min_run": "1s"},
    {"slug": "dear", "display_name": "Dear", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": "1000000", "min_run": "1h"},
]}

# The config's first line notes when the researcher's code began to run.
MARK = """
import json as _j, os as _o, time as _t
_mark = _o.path.expanduser("~/marks.jsonl")
def _note(**kw):
    with open(_mark, "a") as f:
        f.write(_j.dumps({**kw, "at": _t.time()}) + "\\n")
_note(event="loaded", pid=_o.getpid())
"""

SLOW_CONFIG = MARK + f"""
_t.sleep({WORK_S})
_note(event="worked")
"""

# A worker that outlives nothing, and a server that never answers: it blocks the
# config's load forever, ignoring SIGINT and SIGTERM.
HANGS_CONFIG = MARK + """
import signal as _s, subprocess as _sp, sys as _sys
for _n in (_s.SIGINT, _s.SIGTERM):
    _s.signal(_n, _s.SIG_IGN)
_w = _sp.Popen([_sys.executable, "-c",
                "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                "time.sleep(3600)"], start_new_session=True)
_note(event="worker", pid=_w.pid)
while True:
    _t.sleep(1)
"""

EXITS_CONFIG = MARK + """
raise SystemExit(7)
"""


def epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def marks(hub: HubProcess, user: str) -> list[dict]:
    path = hub.state / "homes" / user / "marks.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def configure(hub: HubProcess, user: str, config: str) -> None:
    """Put `config` in the user's home as theirs (made by their first start)."""
    home = hub.state / "homes" / user
    jupyter = home / ".jupyter"
    jupyter.mkdir(parents=True, exist_ok=True)
    (jupyter / "jupyter_server_config.py").write_text(config)
    (home / "marks.jsonl").unlink(missing_ok=True)
    owner = home.stat()
    for path in (jupyter, jupyter / "jupyter_server_config.py"):
        os.chown(path, owner.st_uid, owner.st_gid)


def sessions(hub: HubProcess, token: str) -> list[dict]:
    return hub.service("GET", "api/usage", token).json()["sessions"]


def closed_session(hub: HubProcess, token: str, count: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sessions(hub, token)
        if len(found) >= count and found[-1]["ended"] is not None:
            return found[-1]
        time.sleep(0.2)
    raise AssertionError(f"no closed session #{count}: {sessions(hub, token)}\n"
                         f"{hub.log()[-3000:]}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def start(hub: HubProcess, user: str, token: str, profile: str = "cpu"):
    return hub.api("POST", f"users/{user}/server", token, {"user_options": {"profile": profile}})


def wait_start_failed(hub: HubProcess, user: str, token: str, timeout: float) -> str:
    """The start's failure as the researcher's progress page gets it."""
    r = hub.api("GET", f"users/{user}/server/progress", token)
    events = [json.loads(line[len("data:"):]) for line in r.text.splitlines()
              if line.startswith("data:")]
    failed = [e for e in events if e.get("failed")]
    assert failed, events
    return failed[-1]["message"]


def profile_hub(tmp_path_factory, name: str, profiles: dict, *args: str):
    """A hub of `profiles` (the module's fixtures' shape): started, then closed."""
    base = tmp_path_factory.mktemp(name)
    path = base / "profiles.yaml"
    path.write_text(yaml.safe_dump(profiles))
    h = HubProcess(state=base / "state", admin_password=PW,
                   extra_args=[f"--profiles={path}", *args]).start()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from profile_hub(
        tmp_path_factory, "launch", PROFILES, f"--Spawner.http_timeout={HTTP_TIMEOUT_S}",
        f"--GPULeaseHub.failed_start_limit={LIMIT}", "--GPULeaseHub.failed_start_window=10m")


@pytest.fixture(scope="module")
def admin(hub):
    return hub.token_for("admin", PW)


def test_a_slow_config_is_billed_from_the_launch_and_shows_billed_since(hub, admin):
    token = hub.add_user(admin, "slow", "100")
    configure(hub, "slow", SLOW_CONFIG)
    asked = time.time()
    with ThreadPoolExecutor(2) as pool:  # JupyterHub answers the POST once it is ready
        posted = pool.submit(start, hub, "slow", token)
        # while it works, before it answers: starting, billed since its launch
        deadline = time.monotonic() + WORK_S + 20
        shown = None
        while time.monotonic() < deadline and shown is None and not posted.done():
            mine = hub.service("GET", "api/me/servers", token).json()["servers"]
            shown = next((s for s in mine if s["name"] == "" and s.get("billed_since")), None)
            time.sleep(0.1)
        # what the spawn's progress page streams meanwhile
        progress = pool.submit(hub.api, "GET", "users/slow/server/progress", token)
        r = posted.result()
        progress = progress.result().text
    assert r.status_code in (201, 202), r.text
    assert shown is not None and shown["state"] == "pending", mine
    said = [json.loads(line[len("data:"):])["message"] for line in progress.splitlines()
            if line.startswith("data:")]
    assert any(m.startswith("Starting — billed since ") for m in said), said
    hub.wait_server_ready("slow", token, timeout=WORK_S + 60)
    (session,) = sessions(hub, token)
    seen = {m["event"]: m["at"] for m in marks(hub, "slow")}
    started = epoch(session["started"])
    assert asked <= started <= seen["loaded"], (session, seen)  # from before its code ran
    assert shown["billed_since"] == session["started"]
    # billed while it worked: at least WORK_S by the time it answered
    r = hub.api("DELETE", "users/slow/server", token)
    assert r.status_code in (202, 204), r.text
    session = closed_session(hub, token, 1)
    assert session["billed_ms"] >= WORK_S * 1000, session
    assert session["end_reason"] == "user"


def test_a_start_that_never_answers_is_killed_whole_at_http_timeout(hub, admin):
    token = hub.add_user(admin, "hang", "100")
    configure(hub, "hang", HANGS_CONFIG)
    asked = time.monotonic()
    r = start(hub, "hang", token)
    assert r.status_code in (201, 202, 502, 504), r.text
    session = closed_session(hub, token, 1, timeout=HTTP_TIMEOUT_S + 60)
    took = time.monotonic() - asked
    assert session["end_reason"] == "start_failed", session
    # ended at http_timeout, not after JupyterHub's own waits (http_timeout again,
    # interrupt_timeout, term_timeout: about 2 min in all)
    assert took < HTTP_TIMEOUT_S + 20, took
    seen = {m["event"]: m for m in marks(hub, "hang")}
    started, ended = epoch(session["started"]), epoch(session["ended"])
    assert started <= seen["loaded"]["at"]
    # billed for what ran: from its launch to when the last of it ended
    assert HTTP_TIMEOUT_S * 1000 - 500 <= session["billed_ms"] <= (HTTP_TIMEOUT_S + 5) * 1000
    # nothing of it runs on after its session closed
    assert not alive(seen["worker"]["pid"]), "the start's worker outlived it"
    assert not alive(seen["loaded"]["pid"])
    assert ended <= time.time()
    message = wait_start_failed(hub, "hang", token, 30)
    assert f"did not answer within {HTTP_TIMEOUT_S} s" in message, message
    assert "start_failed" in message, message
    model = hub.api("GET", "users/hang", token).json()
    assert "" not in model.get("servers", {}), model  # not running, nothing pending


def test_a_config_that_exits_fails_the_start_billed_for_what_ran(hub, admin):
    token = hub.add_user(admin, "quits", "100")
    configure(hub, "quits", EXITS_CONFIG)
    r = start(hub, "quits", token)
    assert r.status_code in (201, 202, 502, 504), r.text
    session = closed_session(hub, token, 1)
    assert session["end_reason"] == "start_failed", session
    seen = {m["event"]: m["at"] for m in marks(hub, "quits")}
    assert epoch(session["started"]) <= seen["loaded"] <= epoch(session["ended"])
    assert session["billed_ms"] > 0
    message = wait_start_failed(hub, "quits", token, 30)
    assert "exited before it answered (exit status 7)" in message, message


def test_repeated_failed_starts_are_rationed_and_an_admin_clears_them(hub, admin):
    token = hub.add_user(admin, "loop", "100")
    # a refusal before the launch (not enough credit for its minimum run) is no failure
    r = start(hub, "loop", token, "dear")
    assert r.status_code == 402 or r.status_code >= 400, r.text
    configure(hub, "loop", EXITS_CONFIG)
    for count in range(1, LIMIT + 1):
        start(hub, "loop", token)
        closed_session(hub, token, count)
        hub.wait_server_stopped("loop", token)
    r = start(hub, "loop", token)
    assert r.status_code == 429, r.text
    message = r.json()["message"]
    assert "cpu" in message and f"last {LIMIT} starts failed" in message, message
    assert "exited before it answered" in message and "UTC" in message, message
    assert 0 < int(r.headers["Retry-After"]) <= 600
    assert "Too many users" not in message  # not JupyterHub's concurrent_spawn_limit
    listed = hub.service("GET", "api/failed-starts", token).json()
    assert [p["profile"] for p in listed["paused"]] == ["cpu"], listed
    assert len(listed["failed_starts"]) == LIMIT  # the credit refusal is not one of them
    # another profile is not paused
    configure(hub, "loop", MARK)
    r = start(hub, "loop", token, "cpu-b")
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("loop", token)
    hub.api("DELETE", "users/loop/server", token)
    hub.wait_server_stopped("loop", token)
    # a researcher cannot clear their own; an admin can, and both show in the audit log
    assert hub.service("DELETE", "api/failed-starts/loop", token).status_code == 403
    r = hub.service("DELETE", "api/failed-starts/loop?profile=cpu", admin)
    assert r.status_code == 200 and r.json()["cleared"] == LIMIT, r.text
    audit = hub.service("GET", "api/audit?target=user:loop", admin).json()
    actions = [e["action"] for e in audit["entries"]]
    assert "failed_starts.rationed" in actions and "failed_starts.clear" in actions, audit
    r = start(hub, "loop", token)
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("loop", token)


@pytest.fixture(scope="module")
def metered_hub(tmp_path_factory):
    """A hub whose servers start cold (new programs, not forked warm), with a 1 s billing
    heartbeat and time enough for a slow start."""
    yield from profile_hub(
        tmp_path_factory, "launch-credit", PROFILES, "--GPULeaseHub.heartbeat_interval=1",
        "--Spawner.http_timeout=40", "--GPULeaseHub.warm_start=False")


def test_credit_runs_out_while_it_starts_it_is_stopped_and_billed_from_its_launch(metered_hub):
    """A start whose config works longer than the balance lasts: the heartbeat stops it
    while it is still starting (out_of_credit), billed from its launch; gpulease's stop
    is no failed start of the researcher's, so it is not counted."""
    hub = metered_hub
    admin = hub.token_for("admin", PW)
    credit = 3  # the cpu profile costs a credit a second
    token = hub.add_user(admin, "broke", str(credit))
    configure(hub, "broke", MARK + "\n_t.sleep(30)\n")
    asked = time.monotonic()
    r = start(hub, "broke", token)
    session = closed_session(hub, token, 1, timeout=40)
    took = time.monotonic() - asked
    # the start was interrupted by the stop: said so (JupyterHub's own answer: a bare 500)
    assert r.status_code == 409 and "stopped before it was ready" in r.json()["message"], \
        r.text
    assert session["end_reason"] == "out_of_credit", session
    assert took < 20, took  # not at http_timeout (40 s): at the heartbeat after zero
    seen = {m["event"]: m["at"] for m in marks(hub, "broke")}
    assert epoch(session["started"]) <= seen["loaded"]
    assert credit * 1000 - 1500 <= session["billed_ms"] <= credit * 1000 + 4000, session
    counted = hub.service("GET", "api/failed-starts", token).json()
    assert counted["failed_starts"] == [], counted


def test_a_cold_start_is_billed_from_its_exec(metered_hub):
    hub = metered_hub
    admin = hub.token_for("admin", PW)
    token = hub.add_user(admin, "cold", "100")
    configure(hub, "cold", SLOW_CONFIG)
    asked = time.time()
    r = start(hub, "cold", token)
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("cold", token, timeout=WORK_S + 60)
    (session,) = sessions(hub, token)
    seen = {m["event"]: m["at"] for m in marks(hub, "cold")}
    # from the exec: before the interpreter even read the config (its imports take ~1 s)
    assert asked <= epoch(session["started"]) <= seen["loaded"] - 0.2, (session, seen)
