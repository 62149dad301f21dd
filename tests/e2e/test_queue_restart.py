"""End to end: the admission queue survives a hub restart (gpulease.hub.servers.queue_resume).

The hub of tests/e2e/test_queue.py (two 1g.18gb slices, the mock single-user
server): two servers hold both slices, more starts wait in the queue, the hub is
killed (SIGKILL) or stopped (SIGTERM) and started again. The starts wait in the
new hub's queue in the same order, with their saved options, and start as slices
free; one whose user was deleted while the hub was down is skipped with a log line.
"""

from __future__ import annotations

import signal
import time

import pytest
from jupyterhub import orm

from tests.e2e.test_queue import ADMIN_PW, new_hub, start, stop
from tests.support.queue_reads import queue_of, wait_for_progress

pytestmark = pytest.mark.e2e

WAITING = "Waiting for a free H200 slice 1g.18gb: position {} in the queue"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    made = new_hub(tmp_path_factory, "restart", "--GPULeaseHub.queue_max_wait=2m")
    made.start()
    yield made
    made.close()


@pytest.fixture(scope="module")
def admin(hub):
    return hub.token_for("admin", ADMIN_PW)


def fill_and_queue(hub, admin, holders: list[str], queued: list[str]) -> dict[str, str]:
    tokens = {n: hub.add_user(admin, n) for n in holders + queued}
    for n in holders:
        assert start(hub, n, tokens[n]).status_code in (201, 202)
        hub.wait_server_ready(n, tokens[n])
    for i, n in enumerate(queued, start=1):
        assert start(hub, n, tokens[n]).status_code == 202
        wait_for_progress(hub, n, tokens[n], WAITING.format(i))
    assert [q["user"] for q in queue_of(hub, admin)] == queued
    return tokens


def saved_options(hub, admin, user: str) -> dict | None:
    model = hub.api("GET", f"users/{user}?include_stopped_servers=1", admin).json()
    return model["servers"][""]["user_options"]


def wait_queue(hub, admin, expected: list[dict], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (seen := queue_of(hub, admin)) != expected:
        assert time.monotonic() < deadline, (seen, hub.log()[-4000:])
        time.sleep(0.3)


def entry(user: str, position: int) -> dict:
    return {"user": user, "server": "", "profile": "slice", "position": position}


def test_after_sigkill_queued_starts_wait_again_in_order_and_start_as_slices_free(hub, admin):
    tokens = fill_and_queue(hub, admin, ["ada", "bob"], ["cy", "dan", "eve"])
    hub.kill()
    # eve is deleted while the hub is down (as JupyterHub deletes a user)
    db = orm.new_session_factory(f"sqlite:///{hub.state / 'private' / 'jupyterhub.sqlite'}")()
    db.delete(orm.User.find(db, "eve"))
    db.commit()
    db.close()
    hub.start()
    wait_queue(hub, admin, [entry("cy", 1), entry("dan", 2)])
    assert wait_for_progress(hub, "cy", tokens["cy"], WAITING.format(1))[-1] == WAITING.format(1)
    assert wait_for_progress(hub, "dan", tokens["dan"], WAITING.format(2))[-1] == \
        WAITING.format(2)
    assert ("Queued start of eve/(default) (slice), left by the previous hub, is not started "
            "again: the user no longer exists") in hub.log()
    assert saved_options(hub, admin, "cy") == {"profile": "slice"}  # still the user's choice
    # ada's and bob's servers outlived the kill and hold the slices; each stop frees one
    stop(hub, "ada", tokens["ada"])
    hub.wait_server_ready("cy", tokens["cy"], timeout=30)
    wait_queue(hub, admin, [entry("dan", 1)])
    assert hub.api("GET", "users/dan", tokens["dan"]).json()["servers"][""]["ready"] is False
    stop(hub, "bob", tokens["bob"])
    hub.wait_server_ready("dan", tokens["dan"], timeout=30)
    assert queue_of(hub, admin) == []
    for n in ("cy", "dan"):
        stop(hub, n, tokens[n])


def test_after_sigterm_queued_starts_are_admitted_in_order(hub, admin):
    """SIGTERM stops the embedded box's servers (cleanup_servers): the slices free,
    the first two queued starts take them, in order, and the third waits again."""
    tokens = fill_and_queue(hub, admin, ["gus", "hal"], ["ivy", "jo", "kim"])
    hub.proc.send_signal(signal.SIGTERM)
    assert hub.proc.wait(60) == 0, hub.log()[-3000:]
    hub.start()
    for n in ("ivy", "jo"):
        hub.wait_server_ready(n, tokens[n], timeout=30)
    wait_queue(hub, admin, [entry("kim", 1)])
    assert wait_for_progress(hub, "kim", tokens["kim"], WAITING.format(1))[-1] == \
        WAITING.format(1)
    assert saved_options(hub, admin, "kim") == {"profile": "slice"}
    for n in ("gus", "hal"):  # stopped with the hub, not started again
        assert hub.api("GET", f"users/{n}", tokens[n]).json()["servers"] == {}
    stop(hub, "ivy", tokens["ivy"])
    hub.wait_server_ready("kim", tokens["kim"], timeout=30)
    for n in ("jo", "kim"):
        stop(hub, n, tokens[n])
