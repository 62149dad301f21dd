"""As root: a process that maps a device node and closes its descriptor still holds the device.

A GPU node can be mapped (the driver's memory, its doorbells) and the descriptor
closed: /proc/PID/fd then shows nothing, /proc/PID/map_files still does. The node
here is a loop block device (/dev/loop*), which any root process can map; `holders`
matches block nodes as it matches a GPU's character nodes.
"""

from __future__ import annotations

import glob
import os
import stat
import subprocess
import sys

import pytest

from gpulease.spawners.local.device_holders import end_holders, holders
from tests.conftest import IN_CI

MAP_AND_CLOSE = r"""
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
# libc's mmap, not Python's mmap module, which keeps a duplicate of the descriptor
if libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) in (None, 2**64 - 1):
    sys.exit(f"mmap failed: errno {ctypes.get_errno()}")
os.close(fd)
os.setgid(NOBODY)
os.setuid(NOBODY)  # a tenant: the node was opened as root, as a passed descriptor would be
libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/PID is the tenant's again
print("mapped", flush=True)
time.sleep(120)
"""


def _loop_node() -> tuple[str, tuple[str, int, int]]:
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("CI=true but not root: /proc/PID/map_files needs root")
        pytest.skip("needs root: /proc/PID/map_files is readable by root only")
    for path in sorted(glob.glob("/dev/loop[0-9]*")):
        st = os.stat(path)
        if stat.S_ISBLK(st.st_mode):
            return path, ("b", os.major(st.st_rdev), os.minor(st.st_rdev))
    if IN_CI:
        pytest.fail("CI=true but no /dev/loop* block node to map")
    pytest.skip("no /dev/loop* block node to map")


NOBODY = 65534


@pytest.fixture
def mapper():
    path, node = _loop_node()
    proc = subprocess.Popen([sys.executable, "-c", f"NOBODY = {NOBODY}\n{MAP_AND_CLOSE}", path],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "mapped"
        yield proc, path, node
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_mapping_without_a_descriptor_is_found_and_its_tenant_ended(mapper):
    proc, path, node = mapper
    fds = os.listdir(f"/proc/{proc.pid}/fd")
    assert not any(os.path.realpath(f"/proc/{proc.pid}/fd/{fd}") == path for fd in fds)
    assert holders({node}).get(proc.pid) == NOBODY
    killed, left = end_holders([node], leaving_uid=NOBODY, wait_s=5.0)
    assert killed >= 1 and proc.pid not in left
    assert proc.wait(timeout=10) == -9
