"""What the tests read of the queue through the hub: its entries (api/inventory) and a
pending start's progress messages.
"""

from __future__ import annotations

import json
import time

import requests


def queue_of(hub, admin) -> list[dict]:
    r = hub.service("GET", "api/inventory", admin)
    assert r.status_code == 200, r.text
    return [{k: q[k] for k in ("user", "server", "profile", "position")}
            for q in r.json()["queue"]]


def wait_for_progress(hub, user, token, text, server="", timeout=20.0) -> list[str]:
    """The progress messages of a pending start, up to the first that contains `text`."""
    path = f"users/{user}/servers/{server}/progress" if server else f"users/{user}/server/progress"
    seen = []
    with requests.get(f"{hub.url}/hub/api/{path}", headers={"Authorization": f"token {token}"},
                      stream=True, timeout=timeout) as r:
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + timeout
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                seen.append(json.loads(line[5:])["message"])
                if text in seen[-1]:
                    return seen
            assert time.monotonic() < deadline, seen
    raise AssertionError(f"{text!r} never came: {seen}")
