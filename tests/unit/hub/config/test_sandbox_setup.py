"""Whether the sandbox is on, decided before the host is touched, and said at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulease.hub.config import sandbox_setup
from gpulease.hub.config.sandbox_setup import SandboxSetupError, setup, why_not


def test_why_the_sandbox_cannot_be_on():
    assert why_not(mode="off", is_root=True, accounts=True) == "GPULeaseHub.server_sandbox = off"
    assert why_not(mode="auto", is_root=False, accounts=True) == "the hub does not run as root"
    assert "per_user_accounts is off" in why_not(mode="auto", is_root=True, accounts=False)
    assert why_not(mode="on", is_root=True, accounts=True) == ""


def _setup(mode: str, **kw):
    args = dict(mode=mode, tag="0a1b2c3d", pool="10.213.0.0/16", egress="internet",
                blocked=[], host_ports=[8081], state_root=Path("/nonexistent"),
                is_root=False, accounts=True)
    return setup(**{**args, **kw})


def test_off_says_why_and_what_is_exposed_and_the_hub_listens_on_loopback():
    plan = _setup("auto")
    assert plan.net is None and plan.spawner == {} and plan.host_address == "127.0.0.1"
    (line,) = plan.lines
    assert line.startswith("Sandbox: off (the hub does not run as root): servers share the "
                           "host's network")
    assert "debugger" in line and "/dev/shm" in line and "command line" in line


def test_on_where_the_host_cannot_stops_the_hub_saying_why():
    with pytest.raises(SandboxSetupError, match="server_sandbox = on, but the hub does not "
                                                "run as root"):
        _setup("on")


def test_a_host_that_cannot_make_it_turns_it_off_under_auto(monkeypatch):
    def cannot(*_args):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(sandbox_setup, "_setup", cannot)
    plan = _setup("auto", is_root=True)
    assert plan.net is None
    assert plan.lines[0].startswith("Sandbox: off (the host cannot make it: [Errno 1] "
                                    "Operation not permitted)")
    with pytest.raises(SandboxSetupError, match="the host cannot make it"):
        _setup("on", is_root=True)
