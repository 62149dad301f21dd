"""As root: a process that maps a device node and closes its descriptor still holds the device.

A GPU node can be mapped (the driver's memory, its doorbells) and the descriptor
closed: /proc/PID/fd then shows nothing, /proc/PID/map_files still does. The node
here is a loop block device (/dev/loop*), which any root process can map; `holders`
matches block nodes as it matches a GPU's character nodes.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
import sys
import time

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


# A process whose main thread has ended (SYS_exit, not exit_group) lives on in its other
# threads, and /proc/PID/fd and /proc/PID/map_files are the main thread's: empty. A thread
# that unshares its descriptor table keeps a descriptor the main thread has closed.
HIDE_IN_A_THREAD = r"""
import ctypes, mmap, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
how = sys.argv[2]
fd = os.open(sys.argv[1], os.O_RDONLY)
if how == "map" and libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) in (
        None, 2**64 - 1):
    sys.exit(f"mmap failed: errno {ctypes.get_errno()}")
os.setgid(NOBODY)
os.setuid(NOBODY)
libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
shared = threading.Event()
def keeper():
    if how == "unshare" and libc.unshare(0x400) != 0:  # CLONE_FILES
        sys.exit("unshare failed")
    shared.set()
    time.sleep(120)
threading.Thread(target=keeper).start()
shared.wait()
if how in ("map", "unshare"):
    os.close(fd)
print("hidden", flush=True)
if how == "unshare":
    time.sleep(120)
libc.syscall(60, 0)  # SYS_exit: the main thread alone ends; the keeper holds the device
"""


@pytest.mark.parametrize("how", ["map", "descriptor", "unshare"])
def test_a_device_held_by_a_thread_other_than_the_main_one_is_found_and_ended(how):
    path, node = _loop_node()
    proc = subprocess.Popen([sys.executable, "-c", f"NOBODY = {NOBODY}\n{HIDE_IN_A_THREAD}",
                             path, how], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "hidden"
        assert holders({node}).get(proc.pid) == NOBODY
        killed, left = end_holders([node], leaving_uid=NOBODY, wait_s=5.0)
        assert killed >= 1 and proc.pid not in left
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()
        proc.wait(timeout=10)


# An io_uring instance keeps the files registered with it (IORING_REGISTER_FILES) after
# their descriptors are closed, and gives one back as a descriptor on request
# (IORING_OP_FIXED_FD_INSTALL): /proc/PID/fd shows the ring, its fdinfo the files.
IN_A_RING = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
params = (ctypes.c_char * 120)()
ring = libc.syscall(425, 4, params)  # io_uring_setup
if ring < 0:
    print(f"no io_uring: errno {ctypes.get_errno()}", flush=True)
    sys.exit(0)
fd = os.open(sys.argv[1], os.O_RDONLY)
if libc.syscall(427, ring, 2, (ctypes.c_int * 1)(fd), 1) < 0:  # IORING_REGISTER_FILES
    sys.exit(f"register failed: errno {ctypes.get_errno()}")
os.close(fd)
os.setgid(NOBODY)
os.setuid(NOBODY)
libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
print("registered", flush=True)
time.sleep(120)
"""


def test_a_device_registered_with_an_io_uring_and_closed_is_found_and_ended():
    path, node = _loop_node()
    proc = subprocess.Popen([sys.executable, "-c", f"NOBODY = {NOBODY}\n{IN_A_RING}", path],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if line.startswith("no io_uring"):
            pytest.skip(f"this kernel gives no io_uring ({line})")
        assert line == "registered"
        assert holders({node}).get(proc.pid) == NOBODY
        killed, left = end_holders([node], leaving_uid=NOBODY, wait_s=5.0)
        assert killed >= 1 and proc.pid not in left
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()
        proc.wait(timeout=10)



def test_a_holder_running_a_setuid_program_is_still_its_tenants():
    # A tenant's descriptor survives exec: a setuid-root program that waits (chfn at its
    # password prompt) holds the device with effective uid 0, its real uid the tenant's.
    path, node = _loop_node()
    chfn = shutil.which("chfn")
    if not chfn or not os.stat(chfn).st_mode & stat.S_ISUID:
        pytest.skip("no setuid-root chfn to wait in")
    fd = os.open(path, os.O_RDONLY)

    def tenant():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    proc = subprocess.Popen([chfn, "-r", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=tenant, pass_fds=(fd,))
    os.close(fd)
    try:
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{proc.pid}").st_uid != 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the exec of the setuid program
        assert os.stat(f"/proc/{proc.pid}").st_uid == 0 and proc.poll() is None
        assert holders({node}).get(proc.pid) == NOBODY
        killed, left = end_holders([node], leaving_uid=NOBODY, wait_s=5.0)
        assert killed >= 1 and proc.pid not in left
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()
        proc.wait(timeout=10)
