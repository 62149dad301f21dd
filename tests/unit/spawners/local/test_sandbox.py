"""The hub's side of a server's sandbox: what its process is told, and the namespace pool.

The pool's namespaces are made by a stand-in for gpulease.host.netns (a mock:
making real ones needs root; tests/e2e/test_sandbox.py does it on a real hub)."""

from __future__ import annotations

import errno

import pytest

from gpulease.core.policy.sandbox_net import SandboxNet
from gpulease.spawners.local import sandbox as sandbox_module
from gpulease.spawners.local.sandbox import NamespacePool, Sandbox, enter_spec


def test_the_spec_bounds_shm_and_tmp_by_the_profile_and_keeps_only_what_tmp_would_hide():
    s = Sandbox(3, "tag-3", "/run/netns/tag-3", "10.213.0.5")
    spec = enter_spec(s, memory_bytes=2 << 30, resolv_conf="/var/lib/gl/sandbox/resolv.conf",
                      needed=["/tmp/state", "/tmp/state/homes", "/opt/venv", "",
                              "/tmp/dev/nvidia0", "/tmpfoo/x"])
    assert spec == {"netns": "/run/netns/tag-3", "shm_bytes": 2 << 30, "tmp_bytes": 2 << 30,
                    "resolv_conf": "/var/lib/gl/sandbox/resolv.conf",
                    "keep_in_tmp": ["/tmp/dev/nvidia0", "/tmp/state"]}
    assert Sandbox.from_state(s.state()) == s


@pytest.fixture
def made(monkeypatch):
    """A stand-in for the kernel's namespaces: names made and removed."""
    alive: set[str] = set()

    def create(net, index):
        alive.add(net.netns_name(index))
        return f"/run/netns/{net.netns_name(index)}"

    monkeypatch.setattr(sandbox_module.netns, "create_netns", create)
    monkeypatch.setattr(sandbox_module.netns, "remove_netns", alive.discard)
    return alive


def test_the_pool_hands_out_namespaces_made_ahead_and_never_a_taken_number(made):
    pool = NamespacePool(SandboxNet("0a1b2c3d", "10.213.0.0/24"), ready=2, background=False)
    pool.adopt(Sandbox(0, "0a1b2c3d-0", "/run/netns/0a1b2c3d-0", "10.213.0.2"))  # restarted
    pool.fill()
    assert made == {"0a1b2c3d-1", "0a1b2c3d-2"}
    first = pool.take()
    assert (first.index, first.address) == (1, "10.213.0.3")
    pool.fill()
    second = pool.take()
    assert second.index == 2
    pool.drop(first)
    pool.fill()
    assert "0a1b2c3d-1" not in made  # dropped; a number just freed is used last
    assert pool.take().index == 3
    pool.close()
    assert made == {"0a1b2c3d-2", "0a1b2c3d-3"}  # the ones still taken, by their servers


def test_a_name_that_cannot_be_removed_fails_no_stop_and_its_number_stays_out_of_use(
        made, monkeypatch, caplog):
    """/run/netns bound onto itself after a namespace was made (`ip netns add` does so
    where it is no mount point yet) hides the namespace's mount: unlinking its file
    fails with EBUSY. The drop raised, and the stop that called it ended before closing
    its session. Now it is logged, and the number is not handed out again (its file
    is still there)."""
    pool = NamespacePool(SandboxNet("0a1b2c3d", "10.213.0.0/24"), ready=1, background=False)
    pool.fill()
    stuck = pool.take()

    def busy(name: str) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy", f"/run/netns/{name}")

    monkeypatch.setattr(sandbox_module.netns, "remove_netns", busy)
    pool.drop(stuck)  # no error
    assert f"cannot remove the network namespace {stuck.name}" in caplog.text
    pool.fill()
    assert pool.take().index != stuck.index
