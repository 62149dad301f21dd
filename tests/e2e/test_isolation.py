"""End to end: two researchers on one box cannot reach each other, the hub's secrets or foreign GPUs.

A real `gpulease up` as root (CI runs as root), once with servers forked by
the warm launcher and once started cold, with two users, ada (CPU
profile, 256 MiB) and bob (one declared H200). Their kernels are asked, in
real JupyterLab servers, what they can read, signal, see in their
environment and open. The declared GPUs stand on character device nodes
made here with the NVIDIA major number (195): there is no driver, so
opening a node the cgroup allows fails with ENXIO, one it denies with EPERM.
Which limits mechanism the host gave is printed (`pytest -rA` shows it).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpulease.spawners.local.cgroups import HostReader, choose_mechanism, unit_name
from gpulease.spawners.local.isolation import hub_tag
from tests.support.hubproc import HubProcess, run_in_kernel
from tests.support.isolation_env import hub_python, isolation_gate, shared_tmpdir

ADMIN_PW = "admin-secret-pw"
NVIDIA_MAJOR = 195

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
      - {model: H200, memory: 141Gi}
"""
GPUS = ("GPU-declared-box-0", "GPU-declared-box-1")


# Runs as per-user accounts: skipped where the host cannot, failed under CI=true as root.
pytestmark, _runs_where_it_must = isolation_gate()


@pytest.fixture(scope="module")
def mechanism():
    mech = choose_mechanism(HostReader().facts())
    print(f"\n[isolation] {mech.describe()}")
    return mech


@pytest.fixture(scope="module")
def nodes():
    """Stand-in GPU device nodes, 195:0 and 195:1, that every account may open by mode."""
    folder = shared_tmpdir("dev-")
    paths = []
    for minor in (0, 1):
        path = folder / f"nvidia{minor}"
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
        os.chmod(path, 0o666)
        paths.append(str(path))
    return dict(zip(GPUS, paths, strict=True))


@pytest.fixture(scope="module", params=["warm", "cold"])
def hub(request, tmp_path_factory, nodes):
    """Once with servers forked by the warm launcher (the default), once started cold."""
    base = tmp_path_factory.mktemp(f"iso-{request.param}")
    (base / "profiles.yaml").write_text(PROFILES)
    (base / "inventory.yaml").write_text(INVENTORY)
    (base / "config.py").write_text(
        "c.Spawner.poll_interval = 1\n"
        f"c.GPULeaseHub.device_nodes = {json.dumps({k: [v] for k, v in nodes.items()})}\n")
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=[
        f"--config={base / 'config.py'}", f"--profiles={base / 'profiles.yaml'}",
        f"--inventory={base / 'inventory.yaml'}", "--GPULeaseHub.culler_enabled=False",
        "--GPULeaseHub.queue_max_wait=0",
        f"--GPULeaseHub.warm_start={request.param == 'warm'}",
    ]).start()
    h.start_kind = request.param
    yield h
    h.close()


@pytest.fixture(scope="module")
def admin(hub):
    return hub.token_for("admin", ADMIN_PW)


def _user(hub, admin, name: str) -> str:
    r = hub.service("POST", "api/users", admin, {"name": name, "password": f"{name}-pw-1234"})
    assert r.status_code == 201, r.text
    assert r.json().get("unix_account") == f"gl-{name}", r.json()
    hub.grant(admin, f"user:{name}")
    return hub.token_for(name, f"{name}-pw-1234")


@pytest.fixture(scope="module")
def researchers(hub, admin):
    """ada's and bob's servers (token, server URL), started at once: each start
    request waits while its server starts, one after another they add up."""
    profiles = {"ada": "small", "bob": "gpu"}
    tokens = {name: _user(hub, admin, name) for name in profiles}

    def start(name: str) -> str:
        return hub.start_servers(name, tokens[name], {"": {"profile": profiles[name]}})[""]["url"]

    with ThreadPoolExecutor(len(profiles)) as pool:
        urls = dict(zip(profiles, pool.map(start, profiles), strict=True))
    return {name: (tokens[name], urls[name]) for name in profiles}


@pytest.fixture(scope="module")
def ada(researchers):
    return researchers["ada"]


@pytest.fixture(scope="module")
def bob(researchers):
    return researchers["bob"]


def kernel(hub, who, code: str, timeout: float = 60) -> dict:
    token, url = who
    return json.loads(run_in_kernel(hub.url, url, token, code, timeout=timeout).strip())


WHO_AM_I = """
import json, os, pwd
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "name": pwd.getpwuid(os.getuid()).pw_name, "home": os.environ["HOME"],
                  "pid": os.getpid(), "server_pid": os.getppid(),
                  "cgroup": open("/proc/self/cgroup").read()}))
"""


def test_servers_start_the_way_the_run_says(hub, ada, bob):
    forked = re.findall(r"Spawning .*gpulease-singleuser.*\(forked by warm launcher \d+\)",
                        hub.log())
    assert len(forked) == (2 if hub.start_kind == "warm" else 0), hub.log()[-3000:]


def test_each_researcher_runs_as_their_own_account(hub, ada, bob):
    a, b = kernel(hub, ada, WHO_AM_I), kernel(hub, bob, WHO_AM_I)
    print(f"\n[isolation] ada runs as {a['name']} (uid {a['uid']}), bob as {b['name']} "
          f"(uid {b['uid']})")
    assert (a["name"], b["name"]) == ("gl-ada", "gl-bob")
    assert a["uid"] != b["uid"] and 0 not in (a["uid"], b["uid"], a["gid"], b["gid"])
    assert set(a["groups"]) <= {a["gid"]} and set(b["groups"]) <= {b["gid"]}
    for info, name in ((a, "ada"), (b, "bob")):
        home = hub.state / "homes" / name
        assert info["home"] == str(home)
        st = home.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (info["uid"], info["gid"],
                                                                   0o700)
    assert stat.S_IMODE((hub.state / "homes").stat().st_mode) == 0o755
    assert "trusted-group" not in hub.log() and "own Unix account" in hub.log()


def test_kernel_cannot_read_another_home_or_the_hub_state(hub, ada, bob):
    kernel(hub, bob, "open('secret.txt', 'w').write('bob only'); print('{}')")
    private = hub.state / "private"
    targets = {
        "bob's home": str(hub.state / "homes" / "bob"),
        "bob's file": str(hub.state / "homes" / "bob" / "secret.txt"),
        "private/": str(private),
        "cookie secret": str(private / "jupyterhub_cookie_secret"),
        "ledger": str(private / "gpulease.sqlite"),
        "hub database": str(private / "jupyterhub.sqlite"),
        "CLI token": str(private / "cli_token"),
    }
    assert all(os.path.exists(p) for p in targets.values()), targets
    code = f"""
import json, os
out = {{}}
for what, path in {targets!r}.items():
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read()
        out[what] = 'read'
    except OSError as e:
        out[what] = type(e).__name__ + ': ' + e.strerror
print(json.dumps(out))
"""
    seen = kernel(hub, ada, code)
    assert seen == {what: "PermissionError: Permission denied" for what in targets}, seen


def test_kernel_cannot_signal_another_researchers_processes(hub, ada, bob):
    b = kernel(hub, bob, WHO_AM_I)
    code = f"""
import json, os, signal
out = {{}}
for what, pid, sig in (("bob's server", {b['server_pid']}, 0),
                       ("bob's server", {b['server_pid']}, signal.SIGTERM),
                       ("the hub", {hub.proc.pid}, signal.SIGKILL)):
    try:
        os.kill(pid, sig)
        out[what + ' ' + str(int(sig))] = 'sent'
    except OSError as e:
        out[what + ' ' + str(int(sig))] = type(e).__name__
print(json.dumps(out))
"""
    seen = kernel(hub, ada, code)
    assert set(seen.values()) == {"PermissionError"}, seen
    assert hub.proc.poll() is None
    kernel(hub, bob, "print('{}')")  # bob's server still answers


def test_server_environment_holds_no_hub_secret(hub, ada):
    env = kernel(hub, ada, "import json, os; print(json.dumps(dict(os.environ)))")
    secrets = hub.secrets()
    leaks = [f"{what} in ${key}" for key, value in env.items()
             for what, secret in secrets.items() if secret in value]
    assert not leaks
    assert not {"GPULEASE_ADMIN_PASSWORD", "CONFIGPROXY_AUTH_TOKEN", "GPULEASE_DB_URL"} & set(env)
    assert env["USER"] == "gl-ada" and env["JUPYTERHUB_USER"] == "ada"


def _cgroup_file(hub, controller: str, name: str, mech) -> str:
    tag = hub_tag(str(hub.state.resolve()))
    return f"/sys/fs/cgroup/{controller}/gpulease/{unit_name(f'gl-{name}', '', tag)}"


def test_memory_beyond_the_profile_kills_the_kernel_not_the_hub(hub, ada, bob, mechanism):
    if not mechanism.limits:
        pytest.skip(f"no usable limits mechanism on this host: {mechanism.detail}")
    me = kernel(hub, ada, WHO_AM_I)
    # as the host sees her kernel (in her sandbox, her own cgroups are its root: "/")
    host_view = open(f"/proc/{me['server_pid']}/cgroup").read()  # her server: it lives on
    assert "gpulease/gl-ada._." in host_view, host_view
    assert all(line.endswith(":/") for line in me["cgroup"].splitlines()), me["cgroup"]
    if mechanism.kind == "cgroup1":
        folder = _cgroup_file(hub, "memory", "ada", mechanism)
        assert int(open(f"{folder}/memory.limit_in_bytes").read()) == 256 * 2**20
        cpu = _cgroup_file(hub, "cpu", "ada", mechanism)
        assert open(f"{cpu}/cpu.cfs_quota_us").read().strip() == "100000"
    token, url = ada
    with pytest.raises(Exception):  # noqa: B017 - the kernel dies: no reply, or an error
        run_in_kernel(hub.url, url, token, "x = b'x' * (1 << 30); print(len(x))", timeout=8)
    if mechanism.kind == "cgroup1":
        oom = open(f"{_cgroup_file(hub, 'memory', 'ada', mechanism)}/memory.oom_control").read()
        print(f"\n[isolation] ada's memory cgroup after 1 GiB: {oom.split()}")
        assert "oom_kill 0" not in oom
    assert hub.proc.poll() is None
    assert hub.api("GET", "", token).status_code == 200  # the hub answers
    kernel(hub, bob, "print('{}')")  # bob's server and kernels are unharmed
    assert kernel(hub, ada, WHO_AM_I)["server_pid"] == me["server_pid"]  # ada's server too


def test_a_server_opens_only_its_own_gpu_nodes(hub, ada, bob, admin, nodes, mechanism):
    if not mechanism.devices:
        pytest.skip(f"no cgroup device control on this host ({mechanism.describe()})")
    inv = hub.service("GET", "api/inventory", admin).json()
    assert inv["isolation"]["device_control"] is True, inv["isolation"]
    held = [d["uuid"] for n in inv["nodes"] for g in n["gpus"] for d in g["devices"]
            if d["holder"] and d["holder"]["user"] == "bob"]
    assert len(held) == 1
    mine = nodes[held[0]]
    other = next(p for u, p in nodes.items() if u != held[0])
    code = f"""
import json
out = {{}}
for path in ({mine!r}, {other!r}):
    try:
        open(path, 'rb')
        out[path] = 0
    except OSError as e:
        out[path] = e.errno
print(json.dumps(out))
"""
    seen = kernel(hub, bob, code)
    print(f"\n[isolation] device control by {mechanism.kind}: bob opening his node -> "
          f"{errno.errorcode.get(seen[mine], seen[mine])}, the other -> "
          f"{errno.errorcode.get(seen[other], seen[other])}")
    assert seen[other] == errno.EPERM  # the devices cgroup says no
    assert seen[mine] in (errno.ENXIO, errno.ENODEV, 0)  # allowed; no driver behind it here
    cpu_only = kernel(hub, ada, code)
    assert set(cpu_only.values()) == {errno.EPERM}, cpu_only  # a CPU server opens no GPU node


def test_inventory_says_which_limits_apply(hub, admin, mechanism):
    out = hub.cli("inventory")
    assert out.returncode == 0, out.stderr
    assert "own Unix account" in out.stdout
    assert mechanism.describe() in out.stdout


def _up(state, timeout=60) -> subprocess.CompletedProcess:
    python, _ = hub_python()
    return subprocess.run([python, "-m", "gpulease.hub.cli", "up", f"--state={state}",
                           "--port=1"], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "GPULEASE_ADMIN_PASSWORD": ADMIN_PW})


def test_hub_refuses_a_readable_private_folder_or_a_world_writable_state(tmp_path):
    state = tmp_path / "state"
    (state / "private").mkdir(parents=True)
    os.chmod(state / "private", 0o755)
    done = _up(state)
    assert done.returncode != 0
    assert f"chmod 700 {state / 'private'}" in done.stderr, done.stderr
    os.chmod(state / "private", 0o700)
    os.chmod(state, 0o777)
    done = _up(state)
    assert done.returncode != 0
    assert f"chmod o-w {state}" in done.stderr, done.stderr


def test_hub_refuses_servers_that_accounts_could_not_reach(tmp_path):
    """A state folder under a 0700 folder: the homes would be unreachable; the hub says so."""
    hidden = shared_tmpdir("hidden-") / "hidden"
    hidden.mkdir(mode=0o700)
    os.chmod(hidden, 0o700)
    done = _up(hidden / "state")
    assert done.returncode != 0
    assert "cannot reach" in done.stderr and str(hidden) in done.stderr, done.stderr
    assert "per_user_accounts=False" in done.stderr
