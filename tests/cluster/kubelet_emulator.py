"""The kubelet emulator: a test double standing for the kubelet of emulated Nodes.

Everything else in the test cluster is the real Kubernetes code. For each pod
the real scheduler binds to a Node annotated `kwok.x-k8s.io/node=fake`, this
process runs each container's command as a local process, in a cgroup of
its own, as the pod's user, from the local environment mapped to its image
(tests/cluster/pod_plan.py says what differs from a kubelet); hands it
concrete device IDs from the Node's declared devices in NVIDIA_VISIBLE_DEVICES,
never one device to two pods; "pulls" each image for its `pull_delay_s`
(images.json; Pending, ContainerCreating meanwhile); reports Running with Ready
conditions, each container's `startedAt` the moment its process was exec'd,
and termination with exit codes through the status subresource; honours
deletion with a preStop sleep hook, SIGTERM, the grace period, then SIGKILL of
everything left, as the kubelet does: a grace period of 0 too (a pod removed
from the API server), at any point of its start, within the kubelet's minimum
of MIN_KILL_GRACE_S; and writes events. kwok only keeps the Nodes Ready.

    python -m tests.cluster.kubelet_emulator --kubeconfig K --images images.json --state DIR
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpulease.spawners.local.cgroup_kill import empty_cgroup, remove_dirs
from tests.cluster import dra_driver, pod_plan
from tests.cluster.kube import Kube, KubeError

log = logging.getLogger("kubelet-emulator")
NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
PR_SET_PDEATHSIG = 1
# The field manager of every status it writes: the pod status's one writer.
AGENT = "gpulease-kubelet-emulator"
PR_SET_CHILD_SUBREAPER = 36
# The kubelet's least grace before SIGKILL, even for a pod removed with grace 0
# (kuberuntime's minimumGracePeriodInSeconds).
MIN_KILL_GRACE_S = 2


def _pre_stop_sleep(pod: dict) -> int:
    """Seconds of the first container's preStop sleep action (Kubernetes' `sleep` hook)."""
    containers = pod.get("spec", {}).get("containers") or [{}]
    hook = ((containers[0].get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
    return max(0, int(hook.get("seconds", 0) or 0))


DRA_KEY = "dra"  # PodRun.devices' entry for the devices of its claims


def _uses_claims(container: dict) -> bool:
    return bool((container.get("resources") or {}).get("claims"))


def kube_from_kubeconfig(path: str) -> Kube:
    config = yaml.safe_load(Path(path).read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    return Kube(cluster["server"], Path(cluster["certificate-authority"]),
                Path(user["client-certificate"]), Path(user["client-key"]), agent=AGENT)


def _cgroup_base() -> Path | None:
    """Where each pod's cgroup goes: the v1 freezer hierarchy, or cgroup v2 with cgroup.kill.

    GPULEASE_TEST_EMULATOR_CGROUPS=0 uses none (how a host without them runs)."""
    if os.environ.get("GPULEASE_TEST_EMULATOR_CGROUPS") == "0":
        return None
    for base in (Path("/sys/fs/cgroup/freezer"), Path("/sys/fs/cgroup")):
        if (base / "cgroup.procs").exists() and os.access(base, os.W_OK) and (
                base.name == "freezer" or (base / "cgroup.kill").exists()
                or (base / "cgroup.controllers").exists()):
            return base / f"gpulease-kubelet-emulator-{os.getpid()}"
    return None


def _marked(pod_uid: str) -> list[int]:
    """Processes whose environment carries the pod's marker (where no cgroup holds them)."""
    marker = f"{pod_plan.POD_MARKER}={pod_uid}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                found.append(int(pid))
        except OSError:
            pass
    return found


class _Deleted(Exception):
    """The pod was deleted before its containers started: start nothing."""


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    ip: str = ""
    devices: dict[str, list[str]] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    cgroup: Path | None = None
    started: dict[str, str] = field(default_factory=dict)  # container -> startedAt
    terminating: bool = False
    kill_at: float = 0.0  # monotonic: SIGKILL of what is left (a later, shorter delete moves it)
    launched: threading.Event = field(default_factory=threading.Event)  # start() is over
    done: threading.Event = field(default_factory=threading.Event)


class Emulator:
    def __init__(self, kube: Kube, images: Path, state: Path):
        self.kube = kube
        self.images = images
        self.state = state
        self.lock = threading.Lock()
        self.nodes: dict[str, dict[str, list[str]]] = {}  # emulated node -> declared devices
        self.runs: dict[str, PodRun] = {}
        # Pods removed from the API server before their run was registered: never started.
        self.removed: set[str] = set()
        self.free_ips = [f"127.1.{i // 250}.{i % 250 + 2}" for i in range(250 * 250)]
        # PR_SET_PDEATHSIG fires when the *thread* that forked a child ends, so
        # every pod process is forked by this one long-lived thread.
        self.launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="launcher")
        self.cgroups = _cgroup_base()
        if self.cgroups:
            try:
                self.cgroups.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # a read-only or undelegated cgroupfs: pods are marked
                log.warning("no cgroups for pods (%s): their processes are found by marker", e)
                self.cgroups = None

    # ---- API writes -------------------------------------------------------
    def event(self, pod: dict, reason: str, message: str, kind: str = "Normal") -> None:
        meta = pod["metadata"]
        stamp = pod_plan.now_iso()
        body = {"metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"kind": "Pod", "namespace": meta["namespace"],
                                   "name": meta["name"], "uid": meta["uid"], "apiVersion": "v1"},
                "reason": reason, "message": message, "type": kind,
                "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        try:
            self.kube.create(f"/api/v1/namespaces/{meta['namespace']}/events", body)
        except KubeError as e:  # a namespace being deleted refuses events
            log.info("event %s for %s/%s not written: %s", reason, meta["namespace"],
                     meta["name"], e)

    def set_status(self, run: PodRun, status: dict) -> None:
        try:
            self.kube.patch(f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status",
                            {"metadata": {"uid": run.uid}, "status": status})
        except KubeError as e:
            log.info("status of %s/%s not written: %s", run.namespace, run.name, e)

    def lookup(self, namespace: str):
        def read(kind: str, name: str, key: str) -> str:
            obj = self.kube.get(f"/api/v1/namespaces/{namespace}/{kind}s/{name}")
            if kind == "secret":
                return base64.b64decode(obj["data"][key]).decode()
            return obj["data"][key]
        return read

    # ---- starting a pod ---------------------------------------------------
    def image(self, name: str) -> pod_plan.Image:
        try:
            images = json.loads(self.images.read_text())
        except FileNotFoundError:
            images = {}
        if name not in images:
            raise pod_plan.PlanError(
                "ErrImagePull", f"failed to pull image {name!r}: the kubelet emulator has no local "
                f"stand-in for it (mapped: {', '.join(sorted(images)) or 'none'})")
        entry = images[name]
        return pod_plan.Image(entry["prefix"], int(entry.get("user", 0)), entry.get("env", {}),
                              tuple(entry.get("entrypoint", ())),
                              float(entry.get("pull_delay_s", 0) or 0))

    def mounts(self, pod: dict, container: dict, run: PodRun) -> dict[str, str]:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        found: dict[str, str] = {}
        for mount in container.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            if "persistentVolumeClaim" in volume:
                claim = self.kube.get(f"/api/v1/namespaces/{run.namespace}/persistentvolumeclaims/"
                                      f"{volume['persistentVolumeClaim']['claimName']}")
                pv = self.kube.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")
                host = pv["spec"]["hostPath"]["path"]
            elif "hostPath" in volume:
                host = volume["hostPath"]["path"]
            elif "emptyDir" in volume:
                folder = self.state / "pods" / run.uid / "volumes" / mount["name"]
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(0o1777)
                host = str(folder)
            else:  # projected service-account tokens, config maps: not emulated
                continue
            found[mount["mountPath"]] = host + ("/" + mount["subPath"] if mount.get("subPath") else "")
        return found

    def start(self, pod: dict) -> None:
        meta = pod["metadata"]
        run = PodRun(meta["uid"], meta["namespace"], meta["name"])
        with self.lock:
            if run.uid in self.runs or run.uid in self.removed:
                return
            self.runs[run.uid] = run
        try:
            self._start(pod, run)
        except _Deleted:  # deleted while its images were pulled: nothing was started
            log.info("%s/%s: deleted before its containers started", run.namespace, run.name)
            self.release(run)
            run.done.set()
        except Exception as error:
            e = error if isinstance(error, pod_plan.PlanError) else pod_plan.PlanError(
                # the emulator's own fault: said on the pod like any other, never a silent hang
                "EmulatorError", f"the kubelet emulator failed to start it: {error!r}")
            log.info("%s/%s: %s", run.namespace, run.name, e, exc_info=e is not error)
            self.release(run)  # first, as when a pod ends (wait_exit)
            if e.reason == "UnexpectedAdmissionError":
                self.set_status(run, pod_plan.failed_admission_status(e.reason, e.message))
            else:
                self.set_status(run, pod_plan.waiting_status(pod, e.reason, e.message))
            self.event(pod, "Failed", e.message, "Warning")
            run.done.set()
        finally:
            run.launched.set()

    def _start(self, pod: dict, run: PodRun) -> None:
        node = pod["spec"]["nodeName"]
        with self.lock:
            taken = {d for r in self.runs.values() for ids in r.devices.values() for d in ids}
            run.devices = pod_plan.pick_devices(pod_plan.gpu_requests(pod),
                                                self.nodes.get(node, {}), taken)
        claimed = (dra_driver.prepare(self.kube, pod) if pod["spec"].get("resourceClaims")
                   else None)
        with self.lock:
            taken = {d for r in self.runs.values() for ids in r.devices.values() for d in ids}
            if claimed and taken & set(claimed):  # the scheduler gave one device twice
                raise pod_plan.PlanError(
                    "UnexpectedAdmissionError", f"DRA devices {sorted(taken & set(claimed))} "
                    "are prepared for another pod still running")
            if claimed:
                run.devices[DRA_KEY] = claimed
            run.ip = self.free_ips.pop(0)
        plans, images = [], {}
        start_time = pod_plan.now_iso()
        pulling = [(c, self.image(c["image"])) for c in pod["spec"]["containers"]]
        if any(image.pull_delay_s > 0 for _, image in pulling):
            self.set_status(run, pod_plan.creating_status(pod, start_time))
        for container, image in pulling:
            if image.pull_delay_s > 0:
                self.pull(pod, run, container["image"], image.pull_delay_s)
            self.event(pod, "Pulled", f"Container image {container['image']!r} is the local "
                       f"stand-in {image.prefix}")
            images[container["name"]] = f"local://{image.prefix}"
            plans.append(pod_plan.plan_container(
                pod, container, image, run.ip, self.mounts(pod, container, run),
                {k: v for k, v in run.devices.items() if k != DRA_KEY},
                self.lookup(run.namespace),
                claimed if _uses_claims(container) else None))
        if self.cgroups:
            try:
                (self.cgroups / run.uid).mkdir(exist_ok=True)
                run.cgroup = self.cgroups / run.uid
            except OSError as e:
                log.warning("pod %s/%s without a cgroup (%s)", run.namespace, run.name, e)
        logs = self.state / "pods" / f"{run.namespace}_{run.name}_{run.uid}"
        logs.mkdir(parents=True, exist_ok=True)
        for plan in plans:  # a delete from here on waits for them, then kills them
            proc, execed = self.launcher.submit(
                self._spawn, plan, run, logs / f"{plan.container}.log").result()
            run.procs[plan.container] = proc
            run.started[plan.container] = pod_plan.iso_at(execed)
            self.event(pod, "Started", f"Started container {plan.container} as pid "
                       f"{proc.pid}, uid {plan.uid}, address {run.ip}, exec'd at "
                       f"{pod_plan.precise_iso(execed)}")
        self.set_status(run, pod_plan.running_status(pod, run.ip, run.started, images,
                                                     start_time))
        threading.Thread(target=self.wait_exit, args=(pod, run), daemon=True).start()

    def pull(self, pod: dict, run: PodRun, name: str, delay_s: float) -> None:
        """The image's pull: `delay_s` of waiting, cut short by the pod's deletion."""
        self.event(pod, "Pulling", f"Pulling image {name!r}")
        began = time.monotonic()
        while time.monotonic() - began < delay_s:
            with self.lock:
                if run.terminating:
                    raise _Deleted()
            time.sleep(min(0.05, max(0.0, delay_s - (time.monotonic() - began))))
        self.event(pod, "Pulled", f"Successfully pulled image {name!r} in "
                   f"{time.monotonic() - began:.3f}s")

    def _spawn(self, plan: pod_plan.ProcessPlan, run: PodRun, log_path: Path
               ) -> tuple[subprocess.Popen, float]:
        """The container's process, and the moment (epoch seconds) it was exec'd: taken
        just before the fork, so that the researcher's code never ran before it (Popen
        returns once the exec succeeded)."""
        procs_file = str(run.cgroup / "cgroup.procs") if run.cgroup else ""
        libc = ctypes.CDLL(None, use_errno=True)
        as_root = os.geteuid() == 0  # else (a developer's own run) pods run as this account

        def in_child() -> None:
            # Between fork and exec, in this order: join the pod's cgroup while
            # still root, take the pod's user, then ask to die with the
            # emulator (a change of credentials clears that request).
            if procs_file:
                try:
                    fd = os.open(procs_file, os.O_WRONLY)
                    os.write(fd, str(os.getpid()).encode())
                    os.close(fd)
                except OSError:  # still ended by its marker (kill_rest)
                    pass
            if as_root:
                os.setgroups(plan.groups)
                os.setgid(plan.gid)
                os.setuid(plan.uid)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

        out = open(log_path, "ab")  # noqa: SIM115 - the child keeps it
        try:
            execed = time.time()
            return subprocess.Popen(plan.argv, env=plan.env, cwd=plan.cwd,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=in_child), execed
        except (OSError, subprocess.SubprocessError) as e:
            raise pod_plan.PlanError("StartError", f"{plan.argv[0]}: {e}") from None
        finally:
            out.close()

    # ---- ending a pod -----------------------------------------------------
    def wait_exit(self, pod: dict, run: PodRun) -> None:
        codes, finished = {}, {}
        for name, proc in run.procs.items():
            codes[name] = proc.wait()
            finished[name] = pod_plan.now_iso()
        last = time.time()
        self.kill_rest(run)
        reasons = {n: "Error" for n, c in codes.items() if c and run.terminating}
        # Its devices are free before the API server hears the pod has ended: the
        # scheduler counts a terminal pod's devices as free at once, and may bind the
        # next pod to them straight away (a kubelet's device manager frees them as the
        # pod stops being active, too).
        self.release(run)
        logs = pod_plan.read_logs(self.state / "pods" / f"{run.namespace}_{run.name}_{run.uid}",
                                  run.procs)
        self.set_status(run, pod_plan.terminated_status(pod, codes, run.started, finished, reasons,
                                                        logs))
        run.done.set()
        self.event(pod, "Exited", "Every container exited ("
                   + ", ".join(f"{n}: {c}" for n, c in codes.items())
                   + f"), the last at {pod_plan.precise_iso(last)}")

    def kill_rest(self, run: PodRun) -> None:
        """Nothing of the pod outlives its containers (a PID namespace ends with its PID 1)."""
        for proc in run.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        if run.cgroup and run.cgroup.exists():
            emptied = empty_cgroup("cgroup1", run.uid, [str(run.cgroup)], wait_s=10)
            if not emptied.empty:
                log.warning("pod %s/%s: %s", run.namespace, run.name, emptied.describe())
            remove_dirs([str(run.cgroup)])
        # And every process carrying the pod's marker: all of them where no
        # cgroup could hold the pod, none otherwise.
        for _ in range(50):
            found = _marked(run.uid)
            if not found:
                break
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def release(self, run: PodRun) -> None:
        with self.lock:
            if run.ip:
                self.free_ips.append(run.ip)
            run.devices = {}
            run.ip = ""

    def terminate(self, pod: dict, removed: bool = False) -> None:
        """SIGTERM, the grace period, then SIGKILL. A second delete with a shorter grace
        period (the API server shortens deletionGracePeriodSeconds), or the pod removed
        from the API server (`removed`: a delete with grace 0), shortens the wait as the
        kubelet does, down to its minimum of MIN_KILL_GRACE_S."""
        meta = pod["metadata"]
        grace = 0 if removed else int(meta.get("deletionGracePeriodSeconds", 30))
        kill_at = time.monotonic() + max(grace, MIN_KILL_GRACE_S)
        with self.lock:
            run = self.runs.get(meta["uid"])
            if run is None:
                if removed:  # gone before its run began (a delete with grace 0): never run
                    self.removed.add(meta["uid"])
                return
            if run.terminating:
                if kill_at < run.kill_at:
                    log.info("%s/%s: grace period shortened to %d s", run.namespace, run.name,
                             grace)
                    run.kill_at = kill_at
                return
            run.terminating = True
            run.kill_at = kill_at
        run.launched.wait(60)
        sleep = _pre_stop_sleep(pod)
        if run.procs and not run.done.is_set() and sleep:
            # The preStop hook first, within the grace period (a shorter one, from a
            # second delete, cuts it); SIGTERM after it, with at least the minimum left.
            hook_ends = time.monotonic() + sleep
            self.event(pod, "Killing", f"Running the preStop hook (sleep {sleep} s)")
            while not run.done.wait(0.1) and time.monotonic() < min(hook_ends, run.kill_at):
                pass
            with self.lock:
                run.kill_at = max(run.kill_at, time.monotonic() + MIN_KILL_GRACE_S)
        if run.procs and not run.done.is_set():
            self.event(pod, "Killing", f"Stopping container(s) with grace period {grace} s")
            for proc in run.procs.values():
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGTERM)
            while not run.done.wait(min(max(run.kill_at - time.monotonic(), 0), 0.1)):
                if time.monotonic() >= run.kill_at:
                    self.kill_rest(run)
                    break
        run.done.wait(30)
        try:  # the kubelet's last word: remove the object, this very pod only
            self.kube.delete(f"/api/v1/namespaces/{run.namespace}/pods/{run.name}",
                             {"gracePeriodSeconds": 0, "preconditions": {"uid": run.uid}})
        except KubeError as e:
            log.info("final delete of %s/%s: %s", run.namespace, run.name, e)
        with self.lock:
            self.runs.pop(run.uid, None)

    # ---- watching ---------------------------------------------------------
    def on_node(self, node: dict) -> None:
        meta = node["metadata"]
        annotations = meta.get("annotations", {})
        key, value = NODE_ANNOTATION
        with self.lock:
            if annotations.get(key) == value:
                self.nodes[meta["name"]] = json.loads(
                    annotations.get(pod_plan.DEVICES_ANNOTATION, "{}"))
            else:
                self.nodes.pop(meta["name"], None)

    def on_pod(self, kind: str, pod: dict) -> None:
        meta = pod["metadata"]
        if pod["spec"].get("nodeName") not in self.nodes:
            return
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            threading.Thread(target=self.terminate, args=(pod, kind == "DELETED"),
                             daemon=True).start()
        elif meta["uid"] not in self.runs and pod.get("status", {}).get("phase") in (None, "Pending"):
            threading.Thread(target=self.start, args=(pod,), daemon=True).start()

    def follow(self, path: str, handle, params: dict | None = None,
               vanished=None) -> None:
        """List, then watch from the list's version; list again when the watch expires.
        `vanished(uids)` is told which of what it ran are not in a list: removed
        meanwhile (a delete with grace 0 while the watch was down)."""
        while True:
            try:
                listed = self.kube.get(path, **(params or {}))
                for item in listed["items"]:
                    handle("ADDED", item)
                if vanished is not None:
                    vanished({i["metadata"]["uid"] for i in listed["items"]})
                version = listed["metadata"]["resourceVersion"]
                while True:
                    for event in self.kube.watch(path, version, **(params or {})):
                        if event["type"] == "ERROR":
                            raise KubeError(event["object"].get("code", 500), event["object"],
                                            f"watch {path}")
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            handle(event["type"], event["object"])
            except (KubeError, OSError) as e:
                log.info("re-listing %s after %s", path, e)
                time.sleep(0.2)

    def run(self) -> None:
        # Orphans of pod processes come back to us, not to init, so none escapes.
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1)
        threading.Thread(target=self.reap_orphans, daemon=True).start()
        for node in self.kube.get("/api/v1/nodes")["items"]:  # before any pod is looked at
            self.on_node(node)
        threading.Thread(target=self.follow, args=("/api/v1/nodes",
                         lambda _kind, node: self.on_node(node)), daemon=True).start()
        self.follow("/api/v1/pods", self.on_pod, {"fieldSelector": "spec.nodeName!="},
                    self.end_vanished)

    def end_vanished(self, listed: set[str]) -> None:
        """End the runs of pods removed from the API server while the watch was away."""
        with self.lock:
            gone = [r for uid, r in self.runs.items() if uid not in listed and not r.terminating]
        for run in gone:
            pod = {"metadata": {"uid": run.uid, "namespace": run.namespace, "name": run.name},
                   "spec": {}}
            threading.Thread(target=self.terminate, args=(pod, True), daemon=True).start()

    def reap_orphans(self) -> None:
        """Collect the exit of adopted orphans; our own containers' exits are Popen's to read."""
        me = str(os.getpid())
        while True:
            time.sleep(1)
            with self.lock:
                ours = {p.pid for r in self.runs.values() for p in r.procs.values()}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if fields[0] == "Z" and fields[1] == me and int(pid) not in ours:
                    try:
                        os.waitpid(int(pid), os.WNOHANG)
                    except ChildProcessError:
                        pass

    def shutdown(self) -> None:
        for run in list(self.runs.values()):
            self.kill_rest(run)
        if self.cgroups:
            remove_dirs([str(self.cgroups)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--images", required=True, type=Path)
    parser.add_argument("--state", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    emulator = Emulator(kube_from_kubeconfig(args.kubeconfig), args.images, args.state)

    def stop(*_):
        emulator.shutdown()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    emulator.run()


if __name__ == "__main__":
    main()
