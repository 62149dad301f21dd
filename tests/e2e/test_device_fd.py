"""End to end, as root: a GPU node's descriptor passed out of the server dies with the server.

The devices cgroup checks a node when it is opened, not when an open
descriptor is used. The attack: researcher `mal` runs a cheap CPU-only
server and a GPU server; a kernel of the GPU server opens the GPU's node
and sends the descriptor (SCM_RIGHTS, a Unix socket in the shared home) to
a process of the CPU-only server, which keeps it. Stopping the GPU server
used to end its cgroup only: the receiver kept the GPU open while the
device went back to the pool for the next tenant. Now the stop ends every
tenant process holding the device's own nodes, and the CPU server lives on.

The declared GPU stands on a node made here with /dev/fuse's numbers
(10:229): it has a driver, so it opens for real as any account, and it is
in no server's basic allowed list.
"""

from __future__ import annotations

import json
import os
import stat
import time

import psutil
import pytest

from gpulease.spawners.local.cgroups import HostReader, choose_mechanism
from gpulease.spawners.local.device_holders import holders
from tests.support.hubproc import HubProcess, run_in_kernel
from tests.support.isolation_env import isolation_gate, shared_tmpdir

ADMIN_PW = "admin-secret-pw"
GPU = "GPU-declared-box-0"
FUSE = (10, 229)
PROFILES = """
profiles:
  - {slug: small, display_name: Small CPU, cpu: 1, memory: 256Mi, images: [pytorch],
     price_per_hour: "0.10", min_run: 1m, idle_timeout: 0}
  - {slug: gpu, display_name: One H200, gpu: {model: H200, count: 1}, cpu: 1, memory: 2Gi,
     images: [pytorch], price_per_hour: "1.00", min_run: 1m, idle_timeout: 0}
"""
INVENTORY = """
nodes:
  - name: box
    gpus:
      - {model: H200, memory: 141Gi}
"""
# In the CPU-only server: wait for one descriptor on a socket in the home, keep it.
RECEIVER = """
import os, socket, time
path = os.path.expanduser('~/fd.sock')
if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(1)
c, _ = s.accept()
msg, fds, _, _ = socket.recv_fds(c, 16, 4)
open(os.path.expanduser('~/fd.got'), 'w').write(str(fds[0]))
while True:
    time.sleep(60)
"""


# Runs as per-user accounts: skipped where the host cannot, failed under CI=true as root.
pytestmark, _runs_where_it_must = isolation_gate()


@pytest.fixture(scope="module")
def node():
    path = shared_tmpdir("dev-") / "nvidia0"
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*FUSE))
    os.chmod(path, 0o666)
    return str(path)


@pytest.fixture(scope="module")
def hub(tmp_path_factory, node):
    base = tmp_path_factory.mktemp("fdpass")
    (base / "profiles.yaml").write_text(PROFILES)
    (base / "inventory.yaml").write_text(INVENTORY)
    (base / "config.py").write_text(
        "c.Spawner.poll_interval = 1\n"
        f"c.GPULeaseHub.device_nodes = {json.dumps({GPU: [node]})}\n")
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=[
        f"--config={base / 'config.py'}", f"--profiles={base / 'profiles.yaml'}",
        f"--inventory={base / 'inventory.yaml'}", "--GPULeaseHub.culler_enabled=False",
        "--GPULeaseHub.queue_max_wait=0", "--GPULeaseHub.heartbeat_interval=1",
    ]).start()
    yield h
    h.close()


def test_a_gpu_descriptor_passed_to_another_server_dies_with_the_gpu_server(hub, node):
    mech = choose_mechanism(HostReader().facts())
    if not mech.devices:
        pytest.skip(f"no cgroup device control on this host ({mech.describe()}): any server "
                    "opens any node, so there is no descriptor to smuggle")
    admin = hub.token_for("admin", ADMIN_PW)
    mal = hub.add_user(admin, "mal")
    ready = hub.start_servers("mal", mal, {"": {"profile": "small"}, "g": {"profile": "gpu"}})
    cpu_url, gpu_url = ready[""]["url"], ready["g"]["url"]
    run_in_kernel(hub.url, cpu_url, mal, (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {RECEIVER!r}], start_new_session=True,\n"
        "                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
        "                 stderr=subprocess.DEVNULL)\n"
        "print('{}')\n"))
    home = hub.state / "homes" / "mal"
    deadline = time.monotonic() + 20
    while not (home / "fd.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    sent = json.loads(run_in_kernel(hub.url, gpu_url, mal, (
        "import json, os, socket\n"
        f"fd = os.open({node!r}, os.O_RDWR)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.connect(os.path.expanduser('~/fd.sock'))\n"
        "socket.send_fds(s, [b'x'], [fd])\n"
        "print(json.dumps({'pid': os.getpid()}))\n")).strip())
    deadline = time.monotonic() + 20
    while not (home / "fd.got").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    ident = ("c", *FUSE)
    outside = [p for p in holders({ident}) if p != sent["pid"]]
    assert outside, "the receiver in mal's CPU-only server does not hold the GPU node"
    print(f"\n[fd passing] mal's CPU-only server holds the GPU node in pid(s) {outside}")

    r = hub.api("DELETE", "users/mal/servers/g", mal)
    assert r.status_code in (202, 204), r.text
    hub.wait_server_stopped("mal", mal, "g", timeout=90)

    still = [p for p in outside if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not still, f"pid(s) {still} kept the stopped server's GPU node open"
    assert not holders({ident}), "a process still holds the GPU node after the stop"
    inv = hub.service("GET", "api/inventory", admin).json()
    device = inv["nodes"][0]["gpus"][0]["devices"][0]
    assert device["state"] == "free" and device["holder"] is None, device
    run_in_kernel(hub.url, cpu_url, mal, "print('{}')")  # the CPU-only server lives on
