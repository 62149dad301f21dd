"""End to end: the review's attacks on each server's sandbox (issue 42), each now held.

A real `gpulease up` as root with per-user accounts; two researchers, ada and
bob, and bob's own kernel playing what a hostile researcher would. Each test
failed on the sandbox as first committed (073569a) and states what must hold;
each has its control, so that a refusal is the sandbox's doing, not a broken
probe. What each found there:

- the hub API and the gpulease service now listen on the bridge's .1, which a
  machine next to the box reaches by routing the sandboxes' range to it;
- a start refused for a taken port, after a crash, removes the bridge and the
  table of the servers the crashed hub left running (the next start then
  finds them unreachable and stops them);
- /var/tmp and /run/lock are the host's: what bob leaves there ada sees, and
  it outlives his server;
- the cgroup file system shows bob every other server's cgroup: its user, its
  processes' ids, its memory;
- /run/netns is readable: bob opens another server's namespace file and keeps
  that namespace (and its veth on the bridge) after its server stopped;
- a resolver at a link-local address (Google Cloud's 169.254.169.254) is
  written into the namespaces' resolv.conf while the rules reject it;
- jupyter-server-proxy (new with the sandbox) defers XSRF to the proxied app: a
  page of bob's makes ada's browser post, with her login, to her own web app;
- the host's connection-tracking table (NAT) is shared and unbounded per server:
  one kernel adds thousands of entries a millisecond, and a full table drops
  every new connection of the box;
- where nft is missing the hub says the sandbox is off but leaves its bridge,
  with the .1 of a /24, on the host for good.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import uuid

import pytest
import requests

from tests.support.hubproc import HubProcess, password_of
from tests.support.isolation_env import isolation_gate
from tests.support.kernels import Kernel

ADMIN_PW = "admin-secret-pw"
PROFILES = """
profiles:
  - {slug: small, display_name: Small CPU, cpu: 1, memory: 512Mi, images: [pytorch],
     price_per_hour: "0.10", min_run: 1m, idle_timeout: 0}
"""
OUTSIDE_NET = "203.0.113"  # TEST-NET-3: a machine next to the box, on another link

pytestmark, _runs_where_it_must = isolation_gate(sandbox=True)


# --- hubs, researchers, kernels ---------------------------------------------------------

def _hub(base, *args: str) -> HubProcess:
    (base / "profiles.yaml").write_text(PROFILES)
    return HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=[
        f"--profiles={base / 'profiles.yaml'}", "--GPULeaseHub.culler_enabled=False",
        "--GPULeaseHub.queue_max_wait=0", *args]).start()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = _hub(tmp_path_factory.mktemp("sandbox-attacks"))
    yield h
    h.close()


@pytest.fixture(scope="module")
def admin(hub):
    return hub.token_for("admin", ADMIN_PW)


def _start(hub, admin, name: str) -> tuple[str, str]:
    token = hub.add_user(admin, name)
    return token, hub.start_servers(name, token, {"": {"profile": "small"}})[""]["url"]


@pytest.fixture(scope="module")
def ada(hub, admin):
    return _start(hub, admin, "ada")


def _stop(hub, token: str, name: str) -> None:
    r = hub.api("DELETE", f"users/{name}/server", token)
    assert r.status_code in (202, 204), r.text
    hub.wait_server_stopped(name, token)


MY_ADDRESS = """
import json, socket
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.connect(("10.255.255.255", 9))
    print(json.dumps(s.getsockname()[0]))
"""


def _probe_from(run: list[str], host: str, port: int) -> str:
    code = (f"import socket\ns = socket.socket(); s.settimeout(3)\n"
            f"try:\n    s.connect(({host!r}, {port})); print('open')\n"
            f"except OSError as e:\n    print(type(e).__name__)\n")
    return subprocess.run([*run, sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=30).stdout.strip()


# --- from outside the box ---------------------------------------------------------------

@pytest.fixture
def outside():
    """A machine next to the box: a namespace of the test's own on a link of its own
    (203.0.113.10, the box at .1), with a route to the sandboxes' range through the
    box, as any neighbour on a lab's network can add. Yields the command prefix that
    runs a program there."""
    tag = uuid.uuid4().hex[:6]
    ns, host_end = f"gltest-out-{tag}", f"gltout{tag}"
    run = ["ip", "netns", "exec", ns]
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["ip", "addr", "add", f"{OUTSIDE_NET}.1/24", "dev", host_end],
        ["ip", "link", "set", host_end, "up"],
        [*run, "ip", "addr", "add", f"{OUTSIDE_NET}.10/24", "dev", "eth0"],
        [*run, "ip", "link", "set", "eth0", "up"],
        [*run, "ip", "link", "set", "lo", "up"],
        [*run, "ip", "route", "add", "10.0.0.0/8", "via", f"{OUTSIDE_NET}.1"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=30)
        yield run
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)


def test_a_machine_next_to_the_box_reaches_neither_the_hub_api_nor_the_service(
        hub, ada, outside):
    """Before the sandbox both listened on 127.0.0.1 only; on the bridge's .1 they must
    still answer the servers (and the host) only, never another interface."""
    k = Kernel(hub, ada)
    try:
        urls = k.json("import json, os; print(json.dumps([os.environ['JUPYTERHUB_API_URL'], "
                      "os.environ['GPULEASE_SERVICE_URL']]))")
        # the control: her server reaches both there
        seen_by_ada = k.json(f"""
import json, urllib.request
out = []
for url in {urls!r}:
    try:
        out.append(urllib.request.urlopen(url.rstrip('/') + '/', timeout=5).status)
    except urllib.error.HTTPError as e:
        out.append(e.code)
print(json.dumps(out))
""")
    finally:
        k.close()
    assert all(isinstance(code, int) for code in seen_by_ada), seen_by_ada
    targets = [(u.split("//")[1].split("/")[0].split(":")[0],
                int(u.split("//")[1].split("/")[0].split(":")[1])) for u in urls]
    # the control: the neighbour's route through the box works (it reaches a listener
    # of the test's own on the box's address on its link)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((f"{OUTSIDE_NET}.1", 0))
    listener.listen(4)
    threading.Thread(target=lambda: listener.accept(), daemon=True).start()
    try:
        assert _probe_from(outside, f"{OUTSIDE_NET}.1", listener.getsockname()[1]) == "open"
    finally:
        listener.close()
    seen = {f"{h}:{p}": _probe_from(outside, h, p) for h, p in targets}
    assert "open" not in seen.values(), seen


# --- a refused start after a crash ------------------------------------------------------

def _links(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=True).stdout
    return sorted(n for n in (line.split(":")[1].strip().split("@")[0]
                              for line in out.splitlines()) if n.startswith(prefix))


def test_a_start_refused_after_a_crash_leaves_the_running_servers_their_network(
        tmp_path_factory):
    """After `kill -9` the servers run on, and the next start adopts them; a start in
    between that stops because a port is taken must not take their bridge and rules
    away (today: `_undo_prepare` -> sandbox_setup.teardown removes both, and the next
    start finds the server unreachable and shuts it down)."""
    from gpulease.spawners.local.isolation import hub_tag

    h = _hub(tmp_path_factory.mktemp("sandbox-refused"))
    tag = hub_tag(str(h.state.resolve()))
    try:
        token = h.add_user(h.token_for("admin", ADMIN_PW), "gus")
        url = h.start_servers("gus", token, {"": {"profile": "small"}})[""]["url"]
        k = Kernel(h, (token, url))
        gus_at = k.json(MY_ADDRESS)
        gus_pid = k.json("import json, os; print(json.dumps(os.getppid()))")  # his server
        k.close()
        h.kill()  # SIGKILL: gus's server runs on
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((gus_at.rsplit(".", 1)[0] + ".1", h.hub_port))
        squatter.listen(4)
        try:
            with pytest.raises(RuntimeError):
                h.start()
        finally:
            squatter.close()
        assert "the hub API (JupyterHub.hub_port, hub_ip), is taken" in h.log()
        # what the crashed hub's servers run on is still there
        assert _links(f"glbr{tag}") == [f"glbr{tag}"]
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True,
                                text=True).stdout
        assert f"gpulease_{tag}" in tables, tables
        # and the next start adopts gus's server, reachable as before
        h.start()
        srv = h.wait_server_ready("gus", token)
        k = Kernel(h, (token, srv["url"]))
        assert k.json(MY_ADDRESS) == gus_at
        k.close()
    finally:
        _close_with_servers(h, locals().get("gus_pid"))


def _close_with_servers(h: HubProcess, server_pid: int | None) -> None:
    """Stop the hub with its servers, starting it again where a refused start left
    none running; a server still there after that is ended with its cgroup."""
    if h.proc is not None and h.proc.poll() is not None:
        try:
            h.start()
        except (RuntimeError, TimeoutError):
            pass
    h.close()
    if server_pid is None or not os.path.exists(f"/proc/{server_pid}"):
        return
    for line in open(f"/proc/{server_pid}/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if "gpulease" not in path:
            continue
        name = controllers.split(",")[0].removeprefix("name=") or "unified"
        try:
            for pid in open(f"/sys/fs/cgroup/{name}{path}/cgroup.procs").read().split():
                os.kill(int(pid), 9)
        except OSError:
            pass


# --- what a server leaves on the host ---------------------------------------------------

def test_var_tmp_and_run_lock_are_the_servers_own_and_gone_at_its_stop(hub, admin, ada):
    """Like /tmp and /dev/shm: the other world-writable folders a server has are its own
    (what bob writes there ada does not see, and it does not outlive his server)."""
    bob = _start(hub, admin, "bob")
    marker = f"bob-{uuid.uuid4().hex[:8]}"
    spy, a = Kernel(hub, bob), Kernel(hub, ada)
    try:
        written = spy.json(f"""
import json, os
out = []
for folder in ("/var/tmp", "/run/lock"):
    if os.path.isdir(folder) and os.access(folder, os.W_OK):
        with open(os.path.join(folder, {marker!r}), "w") as f:
            f.write("x" * 4096)
        out.append(folder)
print(json.dumps(out))
""")
        assert written, "bob's server has no /var/tmp or /run/lock it can write"
        seen_by_ada = a.json(f"import json, os; print(json.dumps([f for f in {written!r} "
                             f"if os.path.exists(os.path.join(f, {marker!r}))]))")
        # the control: bob reads his own back
        assert spy.json(f"import json, os; print(json.dumps([f for f in {written!r} "
                        f"if os.path.exists(os.path.join(f, {marker!r}))]))") == written
    finally:
        spy.close()
        a.close()
    _stop(hub, bob[0], "bob")
    left = [f for f in written if os.path.exists(os.path.join(f, marker))]
    for f in left:
        os.unlink(os.path.join(f, marker))
    assert seen_by_ada == [], seen_by_ada
    assert left == [], left


# --- what a server sees of the others ---------------------------------------------------

def _cgroup_dirs(pid: int) -> list[str]:
    """The folders of `pid`'s cgroups under /sys/fs/cgroup (v1 and v2)."""
    out = []
    for line in open(f"/proc/{pid}/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if path in ("", "/"):
            continue
        if controllers == "":
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                if os.path.exists(root + path + "/cgroup.procs"):
                    out.append(root + path)
        else:
            name = controllers.split(",")[0].removeprefix("name=")
            if os.path.exists(f"/sys/fs/cgroup/{name}{path}/cgroup.procs"):
                out.append(f"/sys/fs/cgroup/{name}{path}")
    return out


def test_bob_sees_nothing_of_adas_cgroups(hub, admin, ada):
    """/sys/fs/cgroup names every server's account and lists its processes' ids and
    memory: what hidepid hides in /proc, the cgroup file system tells."""
    bob = _start(hub, admin, "bob2")
    a, spy = Kernel(hub, ada), Kernel(hub, bob)
    try:
        ada_pid = a.json("import json, os; print(json.dumps(os.getpid()))")
        folders = _cgroup_dirs(ada_pid)
        assert folders, open(f"/proc/{ada_pid}/cgroup").read()
        seen = spy.json(f"""
import json, os
out = {{}}
for folder in {folders!r}:
    try:
        out[folder] = open(folder + "/cgroup.procs").read().split()
    except OSError as e:
        out[folder] = type(e).__name__
    try:
        out[folder + " listed"] = os.path.basename(folder) in os.listdir(os.path.dirname(folder))
    except OSError as e:
        out[folder + " listed"] = type(e).__name__
print(json.dumps(out))
""")
    finally:
        a.close()
        spy.close()
        _stop(hub, bob[0], "bob2")
    leaked = {k: v for k, v in seen.items()
              if v is True or (isinstance(v, list) and str(ada_pid) in v)}
    assert leaked == {}, leaked


def test_bob_cannot_open_adas_network_namespace_nor_keep_it_after_her_stop(hub, admin):
    """/run/netns is the host's (0755): bob opens the file of another server's
    namespace, and his descriptor keeps that namespace, and its veth on the hub's
    bridge, after her server stopped."""
    victim = _start(hub, admin, "cy")
    bob = _start(hub, admin, "bob3")
    v, spy = Kernel(hub, victim), Kernel(hub, bob)
    try:
        victim_pid = v.json("import json, os; print(json.dumps(os.getpid()))")
        ino = os.stat(f"/proc/{victim_pid}/ns/net").st_ino
        name = next(n for n in os.listdir("/run/netns")
                    if os.stat(f"/run/netns/{n}").st_ino == ino)
        v.close()
        held = spy.json(f"""
import json, os
try:
    HELD = os.open("/run/netns/{name}", os.O_RDONLY)
    print(json.dumps(os.fstat(HELD).st_ino))
except OSError as e:
    print(json.dumps(type(e).__name__))
""")
        _stop(hub, victim[0], "cy")
        alive_after_stop = [p for p in os.listdir("/proc") if p.isdigit()
                            and _fd_on(p, ino)]
    finally:
        spy.close()
        _stop(hub, bob[0], "bob3")
    assert held != ino, "bob's server opened cy's network namespace"
    assert alive_after_stop == [], alive_after_stop


def _fd_on(pid: str, ino: int) -> bool:
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"net:[{ino}]":
                    return True
            except OSError:
                pass
    except OSError:
        pass
    return False


# --- the resolver -----------------------------------------------------------------------

def test_a_link_local_resolver_is_not_handed_to_namespaces_that_cannot_reach_it():
    """Google Cloud's resolver is the metadata server, 169.254.169.254, which every
    sandbox's rules reject: its resolv.conf must not name it as though it worked (or the
    rules must let DNS to it through)."""
    from gpulease.core.policy.sandbox_net import SandboxNet, nft_ruleset, resolv_conf

    body, said = resolv_conf("nameserver 169.254.169.254\nsearch c.project.internal\n")
    rules = nft_ruleset(SandboxNet("t", "10.213.0.0/24"), host_ports=[8081, 9000],
                        egress="internet")
    assert "169.254.169.254" not in body or "dport 53" in rules, (body, said)


# --- a victim who opens a link ----------------------------------------------------------

ADA_APP = '''
import subprocess, sys, time, urllib.request
app = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        open("/tmp/ada-app.log", "a").write("POST " + self.path + " " + repr(body) + "\\\\n")
        self.send_response(200); self.end_headers(); self.wfile.write(b"done")
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ada's app")
http.server.HTTPServer(("127.0.0.1", 8051), H).serve_forever()
"""
subprocess.Popen([sys.executable, "-c", app], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(50):
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8051/").read().decode())
        break
    except OSError:
        time.sleep(0.1)
'''


def test_a_page_of_bobs_cannot_make_adas_browser_post_to_her_web_app(hub, ada):
    """Her web app is reached at /user/ada/proxy/PORT/ with her login cookie
    (jupyter-server-proxy, added with the sandbox, defers XSRF to the proxied app). A
    cross-origin form post, what a page on bob's server makes her browser send (the
    servers' subdomains of one hub are one site, so her cookie goes with it), must be
    refused as her server's own API refuses it, not handed to her app."""
    k = Kernel(hub, ada)
    try:
        assert k.run(ADA_APP).strip() == "ada's app"
        browser = requests.Session()
        page = browser.get(f"{hub.url}/hub/login", timeout=10)
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        r = browser.post(f"{hub.url}/hub/login", allow_redirects=False, timeout=30,
                         data={"username": "ada", "password": password_of("ada"),
                               "_xsrf": xsrf.group(1) if xsrf else ""})
        assert r.status_code == 302, r.status_code
        server = ada[1]
        assert browser.get(server + "lab", timeout=30).status_code == 200  # her cookie now
        evil = server.replace("://ada.", "://bob.").replace("/user/ada/", "/user/bob/")
        forged = {"Origin": evil.split("/user/")[0], "Referer": evil + "files/x.html",
                  "Content-Type": "application/x-www-form-urlencoded",
                  "Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"}
        # the control: her server's own API refuses that post
        api = browser.post(server + "api/contents", data="type=file", headers=forged,
                           allow_redirects=False, timeout=30)
        assert api.status_code == 403, (api.status_code, api.text[:200])
        proxied = browser.post(server + "proxy/8051/delete-everything", data="all=1",
                               headers=forged, allow_redirects=False, timeout=30)
        reached = k.run("import os\n"
                        "p = '/tmp/ada-app.log'\n"
                        "print(open(p).read() if os.path.exists(p) else '')").strip()
    finally:
        k.close()
    assert "delete-everything" not in reached, (proxied.status_code, reached)


# --- the box's shared tables ------------------------------------------------------------

CONNTRACK_CAP = 4096  # what one server may hold of the host's table (262144 by default)


def test_one_server_cannot_fill_the_hosts_connection_tracking_table(hub, ada):
    """A server's NAT'd flows live in the host's conntrack table; a full table drops
    every new connection of the box (the proxy's to servers, the hub API's). Her kernel
    sends one datagram to each of 3 x CONNTRACK_CAP ports of one address; no more than
    CONNTRACK_CAP may be tracked for her address (e.g. an nft `ct count` limit per
    server, as a container runtime bounds a container's processes)."""
    table = "/proc/net/nf_conntrack"
    if not os.path.exists(table):
        pytest.skip("this kernel has no /proc/net/nf_conntrack to count entries in")
    # RFC 2544's range: routed away, answered by none; one address of its own per run
    target = f"198.18.{uuid.uuid4().int % 250 + 1}.{uuid.uuid4().int % 250 + 1}"
    k = Kernel(hub, ada)
    try:
        at = k.json(MY_ADDRESS)
        k.run(f"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range({3 * CONNTRACK_CAP}):
    try:
        s.sendto(b"x", ({target!r}, 20000 + i))
    except OSError:
        pass
""")
        with open(table) as f:
            held = sum(f"src={at} dst={target} " in line for line in f)
    finally:
        k.close()
    assert held <= CONNTRACK_CAP, held


# --- a host without nft -----------------------------------------------------------------

def test_a_hub_that_cannot_load_its_rules_leaves_no_bridge_behind(tmp_path_factory):
    """Where nft is missing (a fresh Debian without nftables) the hub says the sandbox is
    off, and why; the bridge (with the .1 of a /24 of sandbox_network) it made before it
    found that out must not stay on the host, during its run or after it."""
    from gpulease.spawners.local.isolation import hub_tag

    base = tmp_path_factory.mktemp("sandbox-no-nft")
    tools = base / "sbin-without-nft"
    tools.mkdir()
    for folder in ("/usr/local/sbin", "/usr/sbin", "/sbin"):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name != "nft" and not (tools / name).exists():
                (tools / name).symlink_to(os.path.join(folder, name))
    (base / "profiles.yaml").write_text(PROFILES)
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW,
                   env={"PATH": f"{tools}:/usr/local/bin:/usr/bin:/bin"},
                   extra_args=[f"--profiles={base / 'profiles.yaml'}",
                               "--GPULeaseHub.culler_enabled=False"]).start()
    tag = hub_tag(str(h.state.resolve()))
    try:
        assert "Sandbox: off (" in h.log() and "nft is not installed" in h.log()
        during = _links(f"glbr{tag}")
    finally:
        h.close()
    after = _links(f"glbr{tag}")
    for name in after:
        subprocess.run(["ip", "link", "del", name], capture_output=True)
    assert (during, after) == ([], [])
