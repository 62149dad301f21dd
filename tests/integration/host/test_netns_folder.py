"""/run/netns as `ip netns add` leaves it: a shared mount point of its own, made first.

The first `ip netns add` on a box where /run/netns is no mount point binds the folder
onto itself, over the namespace names already in it: those names can then no longer be
removed (unlink answers EBUSY) and their namespaces never go. A sandboxed server's
stop failed on it (and, before its release was made to carry on, left its billing
session open). gpulease makes the folder a mount point itself before it names a
namespace there (gpulease.host.netns.own_mount_point), as iproute2 does. Each case runs
in a mount namespace of its own with a fresh /run, so the host's is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.isolation_env import isolation_gate

pytestmark, _gate = isolation_gate(sandbox=True)

# In a private mount namespace with an empty /run: name a namespace as gpulease does
# (OURS_FIRST: after making the folder a mount point), let `ip netns add` name one of
# its own, then remove ours; print what the removal came to.
SCRIPT = """
import ctypes, os, subprocess, sys
from gpulease.host import netns
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mount(b"tmpfs", b"/run", b"tmpfs", 0, None) == 0, "a fresh /run"
if sys.argv[1] == "ours-first":
    netns.own_mount_point()
else:
    netns.NETNS_DIR.mkdir(parents=True)
path = netns.NETNS_DIR / "gl-test-1"
path.touch()
assert libc.mount(b"/proc/self/ns/net", str(path).encode(), None, netns.MS_BIND, None) == 0
subprocess.run(["ip", "netns", "add", "theirs"], check=True)
try:
    netns.remove_netns("gl-test-1")
except OSError as e:
    print("remove failed:", e.strerror)
else:
    print("removed" if not path.exists() else "still there")
"""


def _run(order: str) -> str:
    if not shutil.which("unshare") or not shutil.which("ip"):
        pytest.fail("unshare (util-linux) and ip (iproute2) are needed")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                           "-c", SCRIPT, order], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_name_made_after_the_folder_became_a_mount_point_is_removed_after_ip_netns_add():
    assert _run("ours-first") == "removed"


def test_without_it_ip_netns_add_hides_the_name_and_its_removal_fails():
    """The control: what happened before, on a box where /run/netns was no mount point."""
    assert _run("folder-only") == "remove failed: Device or resource busy"
