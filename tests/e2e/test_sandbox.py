"""End to end: each server's sandbox keeps what it listens on, publishes or leaves behind its own.

A real `gpulease up` as root with per-user accounts, once with servers forked
warm and once started cold; two researchers, ada and bob, and their own
kernels. Each attack is played from bob's kernel against what ada's server
has open, and each has its control: the same probe from ada's own server
reaches it, so a refusal is the sandbox's doing, not a broken probe.

Egress is tested against listeners of the test's own: one on the host, and
one in a network namespace the test makes, standing for the internet at the
TEST-NET address 198.51.100.10 and for the cloud metadata service at
169.254.169.254.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urljoin

import pytest
import requests

from tests.support.hubproc import HubProcess, run_in_kernel
from tests.support.isolation_env import isolation_gate
from tests.support.kernels import Kernel

ADMIN_PW = "admin-secret-pw"
PROFILES = """
profiles:
  - {slug: small, display_name: Small CPU, cpu: 1, memory: 512Mi, images: [pytorch],
     price_per_hour: "0.10", min_run: 1m, idle_timeout: 0}
"""
INTERNET = "198.51.100.10"
METADATA = "169.254.169.254"

# Runs as per-user accounts, each server sandboxed: skipped where the host cannot (not
# root, no nft), failed under CI=true as root.
pytestmark, _runs_where_it_must = isolation_gate(sandbox=True)


# --- the test's own listeners ---------------------------------------------------------

LISTENER = """
import socket, sys, threading

def dns():  # every A question answered with 198.51.100.10: the internet's DNS, standing in
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 53))
    while True:
        q, peer = u.recvfrom(512)
        end = 12
        while q[end]:
            end += q[end] + 1
        question = q[12:end + 5]
        u.sendto(q[:2] + b"\\x81\\x80\\x00\\x01\\x00\\x01\\x00\\x00\\x00\\x00" + question
                 + b"\\xc0\\x0c\\x00\\x01\\x00\\x01\\x00\\x00\\x00\\x3c\\x00\\x04"
                 + socket.inet_aton("198.51.100.10"), peer)

threading.Thread(target=dns, daemon=True).start()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 80)); s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"from-the-internet"); c.close()
"""


@pytest.fixture(scope="module")
def internet():
    """A namespace of the test's own, at 198.51.100.10 and 169.254.169.254, port 80,
    routed from the host: what a server's egress would reach out there."""
    tag = uuid.uuid4().hex[:6]
    ns, host_end = f"gltest-inet-{tag}", f"gltinet{tag}"
    run = ["ip", "netns", "exec", ns]
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["ip", "addr", "add", "198.51.100.1/24", "dev", host_end],
        ["ip", "link", "set", host_end, "up"],
        [*run, "ip", "addr", "add", f"{INTERNET}/24", "dev", "eth0"],
        [*run, "ip", "addr", "add", f"{METADATA}/32", "dev", "eth0"],
        [*run, "ip", "link", "set", "eth0", "up"],
        [*run, "ip", "link", "set", "lo", "up"],
        [*run, "ip", "route", "add", "default", "via", "198.51.100.1"],
        ["ip", "route", "add", f"{METADATA}/32", "via", INTERNET],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=30)
        server = subprocess.Popen([*run, sys.executable, "-c", LISTENER],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "listening"
        # the listeners answer the host: a refusal later is the sandbox's
        for address in (INTERNET, METADATA):
            assert _probe_here(address, 80) == "open:from-the-internet"
        yield
    finally:
        if "server" in locals():
            server.kill()
        subprocess.run(["ip", "route", "del", f"{METADATA}/32"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)


@pytest.fixture(scope="module")
def host_listener():
    """A port on the host itself, on every address, answering 'host'."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 0))
    s.listen(16)

    def serve() -> None:
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            c.sendall(b"host")
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    yield s.getsockname()[1]
    s.close()


def _probe_here(host: str, port: int) -> str:
    with socket.socket() as s:
        s.settimeout(3)
        try:
            s.connect((host, port))
            return "open:" + s.recv(64).decode(errors="replace")
        except OSError as e:
            return type(e).__name__


# --- the hubs and researchers ---------------------------------------------------------

def _hub(base, *args: str) -> HubProcess:
    (base / "profiles.yaml").write_text(PROFILES)
    return HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=[
        f"--profiles={base / 'profiles.yaml'}", "--GPULeaseHub.culler_enabled=False",
        "--GPULeaseHub.queue_max_wait=0", *args]).start()


@pytest.fixture(scope="module", params=["warm", "cold"])
def hub(request, tmp_path_factory, internet):
    base = tmp_path_factory.mktemp(f"sandbox-{request.param}")
    (base / "resolv.conf").write_text(f"nameserver 127.0.0.53\nnameserver {INTERNET}\n")
    h = _hub(base, f"--GPULeaseHub.warm_start={request.param == 'warm'}",
             f"--GPULeaseHub.sandbox_resolv_conf={base / 'resolv.conf'}")
    h.start_kind = request.param
    yield h
    h.close()


@pytest.fixture(scope="module")
def admin(hub):
    return hub.token_for("admin", ADMIN_PW)


def _researchers(hub, admin, names) -> dict[str, tuple[str, str]]:
    tokens = {name: hub.add_user(admin, name) for name in names}

    def start(name: str) -> str:
        return hub.start_servers(name, tokens[name], {"": {"profile": "small"}})[""]["url"]

    with ThreadPoolExecutor(len(names)) as pool:
        urls = dict(zip(names, pool.map(start, names), strict=True))
    return {name: (tokens[name], urls[name]) for name in names}


@pytest.fixture(scope="module")
def researchers(hub, admin):
    return _researchers(hub, admin, ["ada", "bob"])


@pytest.fixture(scope="module")
def ada(researchers):
    return researchers["ada"]


@pytest.fixture(scope="module")
def bob(researchers):
    return researchers["bob"]


PROBE = """
import json, socket
def probe(host, port):
    with socket.socket() as s:
        s.settimeout(3)
        try:
            s.connect((host, port))
            try:
                s.settimeout(1)
                return "open:" + s.recv(64).decode(errors="replace")
            except OSError:
                return "open:"
        except OSError as e:
            return type(e).__name__
def my_address():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 9))
        return s.getsockname()[0]
"""


def probes(kernel: Kernel, targets: list[tuple[str, int]]) -> dict[str, str]:
    return kernel.json(PROBE + f"print(json.dumps({{f'{{h}}:{{p}}': probe(h, p) "
                                f"for h, p in {targets!r}}}))")


def address_of(kernel: Kernel) -> str:
    return kernel.json(PROBE + "print(json.dumps(my_address()))")


def refused(result: str) -> bool:
    return not result.startswith("open")


# --- the attacks ------------------------------------------------------------------------

def test_each_server_has_an_address_of_its_own_on_the_hubs_bridge_and_a_working_resolver(
        hub, ada, bob):
    a, b = Kernel(hub, ada), Kernel(hub, bob)
    try:
        ada_at, bob_at = address_of(a), address_of(b)
        resolver = a.json("import json, socket; print(json.dumps([open('/etc/resolv.conf')"
                          ".read(), socket.gethostbyname('models.example')]))")
        urls = a.json("import json, os; print(json.dumps([os.environ['JUPYTERHUB_API_URL'], "
                      "os.environ['GPULEASE_SERVICE_URL']]))")
    finally:
        a.close()
        b.close()
    assert ada_at != bob_at and ada_at.startswith("10.213.") and bob_at.startswith("10.213.")
    assert "Sandbox: each server in a network namespace of its own" in hub.log()
    # the lab's resolver file, without the loopback resolver a namespace cannot reach
    assert resolver == [f"nameserver {INTERNET}\n", INTERNET]
    # the hub API and the service at the bridge's .1, where the namespaces reach them
    bridge = ada_at.rsplit(".", 1)[0] + ".1"
    assert all(url.startswith(f"http://{bridge}:") for url in urls), urls


def test_bob_cannot_subscribe_to_adas_iopub(hub, ada, bob):
    ada_kernel, ada_other, spy = Kernel(hub, ada), Kernel(hub, ada), Kernel(hub, bob)
    try:
        info = ada_kernel.json("import json; from ipykernel.connect import get_connection_file;"
                               " print(json.dumps(json.load(open(get_connection_file()))))")
        ada_at = address_of(ada_kernel)
        ports = [info[k] for k in ("shell_port", "iopub_port", "stdin_port", "control_port",
                                   "hb_port")]
        targets = [(h, p) for p in ports for h in ("127.0.0.1", ada_at)]
        seen_by_bob = probes(spy, targets)
        assert all(map(refused, seen_by_bob.values())), seen_by_bob
        # the control: from ada's own server, her kernel's ports are there
        assert probes(ada_other, [("127.0.0.1", info["iopub_port"])])[
            f"127.0.0.1:{info['iopub_port']}"].startswith("open")

        marker = uuid.uuid4().hex
        subscribe = f"""
import json, time, zmq
ctx = zmq.Context.instance()
sub = ctx.socket(zmq.SUB); sub.setsockopt(zmq.SUBSCRIBE, b""); sub.setsockopt(zmq.LINGER, 0)
for host in {["127.0.0.1", ada_at]!r}:
    sub.connect(f"tcp://{{host}}:{info['iopub_port']}")
got, deadline = [], time.monotonic() + 6
while time.monotonic() < deadline:
    if sub.poll(200):
        got.append(b"".join(sub.recv_multipart()).decode(errors="replace"))
print(json.dumps({{"messages": len(got), "marker": any({marker!r} in g for g in got)}}))
"""
        with ThreadPoolExecutor(2) as pool:
            by_bob = pool.submit(spy.json, subscribe)
            by_ada = pool.submit(ada_other.json, subscribe)
            time.sleep(2.5)
            ada_kernel.run(f"print({marker!r})")
            bob_got, ada_got = by_bob.result(), by_ada.result()
        assert bob_got == {"messages": 0, "marker": False}, bob_got
        assert ada_got["marker"] is True, ada_got  # the control: a subscriber in her sandbox
    finally:
        for k in (ada_kernel, ada_other, spy):
            k.close()


def test_bob_cannot_attach_to_adas_debugger(hub, ada, bob):
    ada_kernel, ada_other, spy = Kernel(hub, ada), Kernel(hub, ada), Kernel(hub, bob)
    try:
        reply = ada_kernel.debug_request("initialize", {
            "clientID": "jupyterlab", "clientName": "JupyterLab", "adapterID": "python",
            "pathFormat": "path", "linesStartAt1": True, "columnsStartAt1": True,
            "supportsVariableType": True, "supportsVariablePaging": True,
            "supportsRunInTerminal": True, "locale": "en"})
        assert reply.get("success") is True, reply
        reply = ada_kernel.debug_request("attach", {})
        assert reply.get("success") is True, reply
        ada_kernel.debug_request("configurationDone", {})
        host, port = ada_kernel.json(
            "import json; print(json.dumps(get_ipython().kernel.debugger.debugpy_client"
            ".get_host_port()))")
        port = int(port)
        ada_at = address_of(ada_kernel)
        seen_by_bob = probes(spy, [("127.0.0.1", port), (ada_at, port)])
        assert all(map(refused, seen_by_bob.values())), seen_by_bob
        # the control: the adapter listens, unauthenticated, for anything in her sandbox
        assert probes(ada_other, [(host, port)])[f"{host}:{port}"].startswith("open")
    finally:
        for k in (ada_kernel, ada_other, spy):
            k.close()


DASHBOARD = """
import os, subprocess, sys, tempfile, time, json
folder = tempfile.mkdtemp()
open(os.path.join(folder, "index.html"), "w").write("ada's dashboard")
subprocess.Popen([sys.executable, "-m", "http.server", "8050", "--bind", "127.0.0.1"],
                 cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 start_new_session=True)
import urllib.request
for _ in range(50):
    try:
        print(json.dumps(urllib.request.urlopen("http://127.0.0.1:8050/").read().decode()))
        break
    except OSError:
        time.sleep(0.1)
"""


def test_bob_cannot_read_adas_dashboard_and_ada_reaches_it_through_the_proxy(hub, ada, bob):
    ada_kernel, spy = Kernel(hub, ada), Kernel(hub, bob)
    try:
        assert ada_kernel.json(DASHBOARD) == "ada's dashboard"
        ada_at = address_of(ada_kernel)
        seen_by_bob = probes(spy, [("127.0.0.1", 8050), (ada_at, 8050)])
        assert all(map(refused, seen_by_bob.values())), seen_by_bob
        # ada's own browser reaches it through her server (jupyter-server-proxy), bob's not
        token, url = ada
        proxied = urljoin(f"{hub.url}/", url) + "proxy/8050/"
        r = requests.get(proxied, headers={"Authorization": f"token {token}"}, timeout=30)
        assert (r.status_code, r.text) == (200, "ada's dashboard")
        r = requests.get(proxied, headers={"Authorization": f"token {bob[0]}"}, timeout=30,
                         allow_redirects=False)
        assert r.status_code in (302, 403) and "ada's dashboard" not in r.text
    finally:
        ada_kernel.close()
        spy.close()


def test_bob_cannot_see_adas_processes_or_the_hubs(hub, ada, bob):
    ada_kernel, spy = Kernel(hub, ada), Kernel(hub, bob)
    try:
        ada_pid = ada_kernel.json("import json, os; print(json.dumps(os.getpid()))")
        # the control: ada reads her own kernel's command line
        assert "ipykernel" in ada_kernel.json(
            f"import json; print(json.dumps(open('/proc/{ada_pid}/cmdline').read()))")
        seen = spy.json(f"""
import json, os
uids = set()
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        uids.add(os.stat(f'/proc/{{pid}}').st_uid)
    except OSError:
        pass
out = {{"uids": sorted(uids), "me": os.getuid()}}
for what, pid in (("ada", {ada_pid}), ("hub", {hub.proc.pid})):
    try:
        out[what] = open(f'/proc/{{pid}}/cmdline').read()
    except OSError as e:
        out[what] = type(e).__name__
print(json.dumps(out))
""")
        assert seen["uids"] == [seen["me"]], seen
        assert (seen["ada"], seen["hub"]) == ("FileNotFoundError", "FileNotFoundError"), seen
    finally:
        ada_kernel.close()
        spy.close()


def test_a_server_reaches_the_hub_api_and_the_internet_but_nothing_of_the_host(
        hub, ada, internet, host_listener):
    k = Kernel(hub, ada)
    try:
        me = k.json("""
import json, os, urllib.request
req = urllib.request.Request(os.environ["JUPYTERHUB_API_URL"] + "/user",
                             headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]})
print(json.dumps(json.load(urllib.request.urlopen(req, timeout=10))["name"]))
""")
        assert me == "ada"
        bridge = address_of(k).rsplit(".", 1)[0] + ".1"
        host_ip = _host_address()
        seen = probes(k, [(INTERNET, 80), (METADATA, 80), (bridge, host_listener),
                          (host_ip, host_listener), (bridge, hub.port), (host_ip, hub.port)])
    finally:
        k.close()
    assert seen.pop(f"{INTERNET}:80") == "open:from-the-internet"
    assert all(map(refused, seen.values())), seen
    # the control: the host reaches its own listener on those addresses
    assert _probe_here(bridge, host_listener) == "open:host"
    assert _probe_here(host_ip, host_listener) == "open:host"
    # NAT needs forwarding, host-wide: on, said so at start, and (when gpulease turned it
    # on) guarded so that the host forwards nothing but its servers' traffic
    assert open("/proc/sys/net/ipv4/ip_forward").read().strip() == "1"
    assert "IP forwarding: " in hub.log()
    if "was already on" not in hub.log():
        guard = subprocess.run(["nft", "list", "table", "inet", "gpulease_forward_guard"],
                               capture_output=True, text=True)
        assert 'iifname != "glbr*" oifname != "glbr*" drop' in guard.stdout, guard


def _host_address() -> str:
    """One of the host's own addresses beyond loopback and the sandboxes' bridges."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        name, address = line.split()[1], line.split()[3].split("/")[0]
        if name != "lo" and not name.startswith(("glbr", "gltinet")):
            return address
    pytest.skip("the host has no address beyond loopback")


def test_no_egress_reaches_nothing_beyond_the_hub(tmp_path_factory, internet):
    h = _hub(tmp_path_factory.mktemp("sandbox-no-egress"), "--GPULeaseHub.server_egress=none")
    try:
        token = h.add_user(h.token_for("admin", ADMIN_PW), "carol")
        url = h.start_servers("carol", token, {"": {"profile": "small"}})[""]["url"]
        seen = json.loads(run_in_kernel(h.url, url, token, PROBE + f"""
print(json.dumps({{"internet": probe({INTERNET!r}, 80), "metadata": probe({METADATA!r}, 80)}}))
""").strip())
        assert "Egress: none" in h.log()
    finally:
        h.close()
    assert all(map(refused, seen.values())), seen


SHARED_MEMORY = """
import ctypes, json, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = 32 << 20
with open("/dev/shm/gl-sandbox-test", "wb") as f:
    f.write(b"x" * size)
key = 0x6c5e7e57
shmid = libc.shmget(key, size, 0o1600)  # IPC_CREAT | 0600
addr = libc.shmat(shmid, None, 0)
ctypes.memset(addr, 1, size)
print(json.dumps({"pid": os.getpid(), "shmid": shmid, "key": key}))
"""


def test_shared_memory_is_the_servers_own_charged_to_it_and_gone_at_its_stop(hub, admin):
    token = hub.add_user(admin, "erin")
    url = hub.start_servers("erin", token, {"": {"profile": "small"}})[""]["url"]
    k = Kernel(hub, (token, url))
    made = k.json(SHARED_MEMORY)
    pid = made["pid"]
    ns = {kind: os.stat(f"/proc/{pid}/ns/{kind}").st_ino for kind in ("mnt", "ipc", "net")}
    # the host sees neither her segment nor her file
    host_keys = [line.split()[0] for line in open("/proc/sysvipc/shm").read().splitlines()[1:]]
    assert str(made["key"]) not in host_keys
    assert not os.path.exists("/dev/shm/gl-sandbox-test")
    # the control: inside her namespaces both are there
    inside = subprocess.run(["nsenter", "-t", str(pid), "-m", "-i", "sh", "-c",
                             "cat /proc/sysvipc/shm; ls /dev/shm"],
                            capture_output=True, text=True, check=True).stdout
    assert str(made["key"]) in inside and "gl-sandbox-test" in inside
    # charged to her server's memory cgroup: its memory.stat counts the 64 MiB as shmem
    folder = _memory_cgroup(pid)
    assert "/gl-erin." in folder, folder  # her server's own cgroup, not the hub's
    stat = dict(line.split() for line in open(f"{folder}/memory.stat"))
    assert int(stat["shmem"]) >= 64 << 20, stat
    r = hub.api("DELETE", "users/erin/server", token)
    assert r.status_code in (202, 204), r.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and hub.api("GET", "users/erin", token).json()[
            "servers"]:
        time.sleep(0.3)
    # gone with the last of its processes: no process is in her namespaces any more
    left = {kind: [p for p in os.listdir("/proc") if p.isdigit() and _ns_of(p, kind) == ino]
            for kind, ino in ns.items()}
    assert left == {"mnt": [], "ipc": [], "net": []}, left


def _memory_cgroup(pid: int) -> str:
    """The folder of `pid`'s memory cgroup, as the host sees it (v2, or v1's memory)."""
    for line in open(f"/proc/{pid}/cgroup").read().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            folder = f"/sys/fs/cgroup{path}"
        elif "memory" in controllers.split(","):
            folder = f"/sys/fs/cgroup/memory{path}"
        else:
            continue
        if os.path.exists(f"{folder}/memory.stat"):
            return folder
    pytest.fail(f"no memory cgroup for {pid}: {open(f'/proc/{pid}/cgroup').read()}")


def _ns_of(pid: str, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


# --- the hub's own side -----------------------------------------------------------------

def _own_namespaces(tag: str) -> dict[str, int]:
    """This hub's named namespaces: name -> inode (a new one made under an old name differs)."""
    try:
        names = [n for n in os.listdir("/run/netns") if n.startswith(f"{tag}-")]
    except FileNotFoundError:
        return {}
    return {n: os.stat(f"/run/netns/{n}").st_ino for n in names}


def _links(prefix: str) -> list[str]:
    return sorted(_link_indexes(prefix))


def _link_indexes(prefix: str) -> dict[str, int]:
    """Host interfaces named with `prefix`: name -> ifindex (never reused soon, where a
    namespace's inode number may be: the kernel hands freed ones out again)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=True).stdout
    links = {}
    for line in out.splitlines():
        index, name = line.split(":")[:2]
        name = name.strip().split("@")[0]
        if name.startswith(prefix):
            links[name] = int(index)
    return links


def test_after_a_hub_crash_what_it_left_is_reconciled_and_a_stop_leaves_nothing(
        tmp_path_factory):
    from gpulease.spawners.local.isolation import hub_tag

    h = _hub(tmp_path_factory.mktemp("sandbox-crash"))
    tag = hub_tag(str(h.state.resolve()))
    try:
        token = h.add_user(h.token_for("admin", ADMIN_PW), "fay")
        url = h.start_servers("fay", token, {"": {"profile": "small"}})[""]["url"]
        k = Kernel(h, (token, url))
        # her server's process (the kernel's parent): it outlives the kernel
        fay_at, server_pid = address_of(k), k.json("import json, os; print(os.getppid())")
        k.close()
        fay_ns = os.stat(f"/proc/{server_pid}/ns/net").st_ino
        deadline = time.monotonic() + 10  # fay's and the two made ahead
        while len(_own_namespaces(tag)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = _own_namespaces(tag)
        assert fay_ns in before.values() and len(before) == 3, before
        veths_before = _link_indexes(f"glv{tag}")
        h.kill()  # SIGKILL: nothing of the hub cleans up
        assert _own_namespaces(tag) == before
        h.start()
        srv = h.wait_server_ready("fay", token)
        k = Kernel(h, (token, srv["url"]))
        assert address_of(k) == fay_at  # her server ran on, in its namespace
        k.close()
        assert "2 namespace(s) a stopped hub left were removed, 1 of servers still running kept" \
            in h.log()
        after = _own_namespaces(tag)
        assert fay_ns in after.values(), (before, after)
        # the two it had made ahead went, with their veths (new ones were made since)
        fay_veth = f"glv{tag}{next(n for n, i in before.items() if i == fay_ns).split('-')[1]}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            veths_after = _link_indexes(f"glv{tag}")
            if len(veths_after) == len(after):
                break
            time.sleep(0.2)
        assert veths_after[fay_veth] == veths_before[fay_veth]
        gone = {i for n, i in veths_before.items() if n != fay_veth}
        assert len(gone) == 2 and not gone & set(veths_after.values()), (veths_before,
                                                                          veths_after)
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                                check=True).stdout
        assert tables.count(f"gpulease_{tag}") == 1, tables
    finally:
        h.close()
    assert _own_namespaces(tag) == {}
    assert _links(f"glbr{tag}") == []
    assert f"gpulease_{tag}" not in subprocess.run(["nft", "list", "tables"],
                                                   capture_output=True, text=True).stdout


def test_up_stops_before_sending_any_secret_to_a_port_another_program_holds():
    """A program on the proxy's API port gets nothing; nothing of the hub is left running."""
    from tests.support.isolation_env import hub_python, shared_tmpdir

    received: list[bytes] = []
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(4)
    port = squatter.getsockname()[1]

    def record() -> None:
        while True:
            try:
                c, _ = squatter.accept()
            except OSError:
                return
            c.settimeout(2)
            try:
                received.append(c.recv(65536) or b"(connected)")
            except OSError:
                received.append(b"(connected)")
            c.close()

    threading.Thread(target=record, daemon=True).start()
    state = shared_tmpdir("up-ports-") / "state"  # per-user accounts must reach its homes
    python, _ = hub_python()
    public = _free_port()
    done = subprocess.run(
        [python, "-m", "gpulease.hub.cli", "up", f"--state={state}", f"--port={public}",
         f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "GPULEASE_ADMIN_PASSWORD": ADMIN_PW})
    squatter.close()
    assert done.returncode == 1, done.stderr[-3000:]
    assert (f"port {port} on 127.0.0.1, the proxy's API (ConfigurableHTTPProxy.api_url), "
            "is taken (another program listens there)") in done.stderr, done.stderr[-3000:]
    assert "Nothing was started and no secret was sent" in done.stderr
    assert received == []
    proxy_token = (state / "private" / "proxy_token").read_text().strip()
    assert proxy_token
    left = subprocess.run(["pgrep", "-af", str(state)], capture_output=True, text=True).stdout
    assert left == "", left
    assert _probe_here("127.0.0.1", public) == "ConnectionRefusedError"
    from gpulease.spawners.local.isolation import hub_tag

    assert _links(f"glbr{hub_tag(str(state.resolve()))}") == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_forwarding_gpulease_turned_on_routes_nothing_but_its_servers(hub, internet):
    """Two networks of the test's own behind the host, neither a gpulease bridge: with the
    guard the host does not route between them; the control, the guard taken away for a
    moment, shows the route is otherwise there."""
    from gpulease.core.policy.sandbox_net import forward_guard_ruleset
    from gpulease.host.netns import load_ruleset

    if "was already on" in hub.log():
        pytest.skip("this host forwarded before gpulease: its own firewall decides")
    tag = uuid.uuid4().hex[:6]
    ns, host_end = f"gltest-else-{tag}", f"gltelse{tag}"
    run = ["ip", "netns", "exec", ns]
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["ip", "addr", "add", "198.18.0.1/24", "dev", host_end],
        ["ip", "link", "set", host_end, "up"],
        [*run, "ip", "addr", "add", "198.18.0.10/24", "dev", "eth0"],
        [*run, "ip", "link", "set", "eth0", "up"],
        [*run, "ip", "route", "add", "default", "via", "198.18.0.1"],
    ]
    inet_ns = next(n for n in os.listdir("/run/netns") if n.startswith("gltest-inet-"))
    connect = ["ip", "netns", "exec", inet_ns, sys.executable, "-c",
               "import socket; s = socket.create_connection(('198.18.0.10', 80), timeout=2);"
               "print(s.recv(64).decode())"]
    server = None
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=30)
        server = subprocess.Popen([*run, sys.executable, "-c", LISTENER],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "listening"
        guarded = subprocess.run(connect, capture_output=True, text=True, timeout=30)
        assert guarded.returncode != 0 and "TimeoutError" in guarded.stderr, guarded
        subprocess.run(["nft", "delete", "table", "inet", "gpulease_forward_guard"],
                       check=True, timeout=30)
        try:
            open_route = subprocess.run(connect, capture_output=True, text=True, timeout=30)
        finally:
            load_ruleset(forward_guard_ruleset())
        assert open_route.stdout.strip() == "from-the-internet", open_route
    finally:
        if server is not None:
            server.kill()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
