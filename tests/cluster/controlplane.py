"""Start, share and stop the test control plane.

One supervisor process per run owns every component (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok, the kubelet emulator): it
starts them in order, waits for each to be ready, writes `state.json`, and
stops them all — SIGTERM, then SIGKILL — when it is told to or when the last
client that registered in `clients/` has gone. Components die with it
(PR_SET_PDEATHSIG), so even a SIGKILLed test run leaves no process behind.

Pytest workers (pytest-xdist included) share one control plane through a
lock file: the first starts the supervisor, each registers its pid.

By hand (scripts/cluster-up runs this):
    python -m tests.cluster.controlplane serve --dir /tmp/my-cluster
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

import yaml

from tests.cluster import components as c
from tests.cluster.kube import Kube
from tests.cluster.pki import Pki, make_pki

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tests" / "cluster" / "tools" / "bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
            "kubectl")
READY_TIMEOUT_S = 90


class ControlPlaneError(RuntimeError):
    pass


def missing_tools(bin_dir: Path = TOOLS) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Supervisor:
    """Runs the components of one control plane (the `serve` command)."""

    def __init__(self, root: Path, bin_dir: Path = TOOLS):
        ports = c.Ports(*_free_ports(6))
        self.layout = c.Layout(root, bin_dir, ports)
        self.procs: dict[str, subprocess.Popen] = {}

    def prepare(self) -> None:
        layout = self.layout
        layout.logs.mkdir(parents=True, exist_ok=True)
        pki = make_pki(layout.pki, c.SERVICE_IP)
        for who in ("admin", "controller-manager", "scheduler", "kwok", "kubelet-emulator"):
            cert, key = pki.client(who)
            layout.kubeconfig(who).write_text(yaml.safe_dump(
                c.kubeconfig(layout.server, pki.ca, cert, key, who)))
        (layout.root / "scheduler.yaml").write_text(yaml.safe_dump(c.scheduler_config(layout)))
        (layout.root / "kwok.yaml").write_text(yaml.safe_dump_all(c.kwok_stages()))
        images = layout.root / "images.json"
        if not images.exists():
            images.write_text("{}")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.layout.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=ROOT, start_new_session=True,
                preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))  # PR_SET_PDEATHSIG
        finally:
            log.close()

    def _wait(self, name: str, ready, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {proc.returncode}; the end of its "
                                        f"log ({self.layout.logs / (name + '.log')}):\n"
                                        f"{_tail(self.layout.logs / (name + '.log'))}")
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not answering yet
                pass
            time.sleep(0.1)
        raise ControlPlaneError(f"{name} not ready within {timeout:g} s; the end of its log:\n"
                                f"{_tail(self.layout.logs / (name + '.log'))}")

    def admin(self) -> Kube:
        cert, key = Pki(self.layout.pki).client("admin")
        return Kube(self.layout.server, self.layout.pki / "ca.crt", cert, key, timeout=10)

    def start(self) -> dict:
        started = time.monotonic()
        layout = self.layout
        self.prepare()
        timings = {}
        self._spawn("etcd", c.etcd_argv(layout))
        self._wait("etcd", lambda: _port_open(layout.ports.etcd_client))
        timings["etcd"] = time.monotonic() - started
        self._spawn("kube-apiserver", c.apiserver_argv(layout))
        admin = self.admin()
        self._wait("kube-apiserver", lambda: admin.request("GET", "/readyz").get("message") == "ok")
        timings["kube-apiserver"] = time.monotonic() - started
        version = admin.get("/version")
        self._spawn("kube-controller-manager", c.controller_manager_argv(layout))
        self._spawn("kube-scheduler", c.scheduler_argv(layout))
        self._spawn("kwok", c.kwok_argv(layout))
        self._spawn("kubelet-emulator", c.emulator_argv(layout, sys.executable))
        # Ready means working: the service-account controllers made `default`'s
        # account, and the scheduler holds no lock but answers its health check.
        self._wait("kube-controller-manager",
                   lambda: admin.get("/api/v1/namespaces/default/serviceaccounts/default"))
        self._wait("kube-scheduler", lambda: _healthy(layout.ports.scheduler))
        self._wait("kwok", lambda: _port_open(layout.ports.kwok))
        timings["all"] = time.monotonic() - started
        state = {"server": layout.server, "kubeconfig": str(layout.kubeconfig("admin")),
                 "ca": str(layout.pki / "ca.crt"), "root": str(layout.root),
                 "bin": str(layout.bin), "images": str(layout.root / "images.json"),
                 "supervisor": os.getpid(), "ports": asdict(layout.ports),
                 "pids": {n: p.pid for n, p in self.procs.items()},
                 "version": version["gitVersion"], "etcd": _etcd_version(layout),
                 "kwok": _kwok_version(layout), "ready_s": round(timings["all"], 2),
                 "timings_s": {k: round(v, 2) for k, v in timings.items()}}
        tmp = layout.root / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.rename(layout.root / "state.json")
        return state

    def stop(self) -> None:
        for name in reversed(c.STARTUP_ORDER):
            proc = self.procs.get(name)
            if proc and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            if proc:
                try:  # whatever the component left in its group
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _port_open(port: int) -> bool:
    with closing(socket.socket()) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _healthy(port: int) -> bool:
    import ssl
    import urllib.request
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the scheduler's own self-signed serving cert
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context,
                                timeout=2) as r:
        return r.read() == b"ok"


def _etcd_version(layout: c.Layout) -> str:
    out = subprocess.run([layout.tool("etcd"), "--version"], capture_output=True, text=True)
    return out.stdout.split("\n")[0].split(":")[-1].strip()


def _kwok_version(layout: c.Layout) -> str:
    out = subprocess.run([layout.tool("kwok"), "--version"], capture_output=True, text=True)
    words = out.stdout.split()  # "kwok version v0.8.0 go1.26.8 (linux/amd64)"
    return words[2] if len(words) > 2 else "?"


def _add_samples(supervisor: Supervisor) -> None:
    from tests.cluster.nodes import GpuNode, node_object
    admin = supervisor.admin()
    for spec in (GpuNode("gpu-mig", mig={"1g.18gb": 7}), GpuNode("gpu-full", gpus=8)):
        admin.create("/api/v1/nodes", node_object(spec))
    images = supervisor.layout.root / "images.json"
    images.write_text(json.dumps({"gpulease/singleuser:test": {
        "prefix": str(Path(sys.executable).parent.parent), "user": 1000}}))


def serve(root: Path, clients: bool, samples: bool = False) -> int:
    """Run a control plane in `root` until SIGTERM/SIGINT, or (clients) until no client is left."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # pods run as other users and need to reach their volumes below it
    supervisor = Supervisor(root)
    stopping = False
    (root / "supervisor.pid").write_text(str(os.getpid()))

    def on_signal(*_):
        nonlocal stopping
        stopping = True
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        state = supervisor.start()
    except Exception as e:  # noqa: BLE001 - reported to whoever waits
        (root / "failed").write_text(f"{type(e).__name__}: {e}")
        supervisor.stop()
        return 1
    if samples:
        _add_samples(supervisor)
    print(f"control plane ready in {state['ready_s']} s: Kubernetes {state['version']}, "
          f"etcd {state['etcd']}, kwok {state['kwok']}\n"
          f"  export KUBECONFIG={state['kubeconfig']}\n"
          f"  {state['bin']}/kubectl get nodes", flush=True)
    try:
        while not stopping:
            time.sleep(0.5)
            for name, proc in supervisor.procs.items():
                if proc.poll() is not None:
                    (root / "failed").write_text(f"{name} exited with {proc.returncode}:\n"
                                                 f"{_tail(supervisor.layout.logs / (name + '.log'))}")
                    stopping = True
            # Whoever started us registered before doing so: no client, no run.
            # Decided under the lock: a client attaching now either registered
            # in time (we serve on) or finds no state.json and starts afresh.
            if clients and not _live_clients(root):
                with open(root / "lock", "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    if not _live_clients(root):
                        (root / "state.json").unlink(missing_ok=True)
                        break
    finally:
        (root / "state.json").unlink(missing_ok=True)
        supervisor.stop()
        if clients:  # a test run's cluster is thrown away; its logs stay for a post-mortem
            for data in ("etcd", "pki", "emulator"):
                shutil.rmtree(root / data, ignore_errors=True)
        (root / "supervisor.pid").unlink(missing_ok=True)
    return 0


def _live_clients(root: Path) -> list[int]:
    alive = []
    for entry in (root / "clients").glob("*"):
        pid = int(entry.name)
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            entry.unlink(missing_ok=True)
    return alive


def attach(root: Path, timeout: float = 180) -> dict:
    """Register this process as a client of the control plane in `root`, starting it if need be."""
    root.mkdir(parents=True, exist_ok=True)
    _refuse_foreign(root)
    (root / "clients").mkdir(exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (root / "clients" / str(os.getpid())).touch()
        state_file = root / "state.json"
        if not state_file.exists() or not _alive(json.loads(state_file.read_text())["supervisor"]):
            _wait_for_previous(root)
            for old in root.iterdir():  # a dead run's etcd data must not be reused
                if old.name not in ("lock", "clients"):
                    shutil.rmtree(old) if old.is_dir() else old.unlink()
            log = open(root / "supervisor.log", "ab")  # noqa: SIM115 - the child keeps it
            subprocess.Popen([sys.executable, "-m", "tests.cluster.controlplane", "serve",
                              "--dir", str(root), "--until-clients-gone"],
                             cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
        deadline = time.monotonic() + timeout
        while not state_file.exists():
            if (root / "failed").exists():
                raise ControlPlaneError((root / "failed").read_text())
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"no control plane within {timeout:g} s; see "
                                        f"{root}/supervisor.log and {root}/logs/")
            time.sleep(0.1)
        return json.loads(state_file.read_text())


def _refuse_foreign(root: Path) -> None:
    """The run's folder (in /tmp, under a name anyone can guess) must be ours alone: whoever
    could write there could map an image to their own programs (images.json), which the
    emulator would run, as root when the tests run as root."""
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ControlPlaneError(
            f"{root} is not a folder of this account's alone (uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}): no control plane is run from it; move it away")


def _wait_for_previous(root: Path, wait_s: float = 30) -> None:
    """A supervisor still stopping in `root` must be gone before a new one starts there."""
    try:
        pid = int((root / "supervisor.pid").read_text())
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + wait_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def detach(root: Path, wait_s: float = 30) -> bool:
    """Unregister; the last client waits for the supervisor to have stopped everything.

    True for the last client (the control plane is gone)."""
    state_file = root / "state.json"
    supervisor = json.loads(state_file.read_text())["supervisor"] if state_file.exists() else 0
    (root / "clients" / str(os.getpid())).unlink(missing_ok=True)
    if _live_clients(root):
        return False
    deadline = time.monotonic() + wait_s
    while supervisor and _alive(supervisor) and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our own exited child) no longer runs anything.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The gpulease test control plane")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="run a control plane until interrupted")
    run.add_argument("--dir", type=Path, required=True, help="its files (made if missing)")
    run.add_argument("--until-clients-gone", action="store_true",
                     help="stop once every process registered in DIR/clients has exited")
    run.add_argument("--sample-nodes", action="store_true",
                     help="add two emulated GPU nodes (7 MIG 1g.18gb slices; 8 whole H200s) "
                          "and map gpulease/singleuser:test to this Python's environment")
    args = parser.parse_args(argv)
    missing = missing_tools()
    if missing:
        print(f"missing {', '.join(missing)} in {TOOLS}: run `make cluster-tools` (needs Go)",
              file=sys.stderr)
        return 2
    return serve(args.dir, args.until_clients_gone, args.sample_nodes)


if __name__ == "__main__":
    sys.exit(main())
