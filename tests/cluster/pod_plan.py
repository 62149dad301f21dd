"""The kubelet emulator's decisions, as plain functions over the pod's JSON.

How a container of a pod becomes a local process (argv, environment, user,
working folder), which devices a pod is given, and the status a kubelet
reports at each step. The emulator (tests/cluster/kubelet_emulator.py) does
the I/O. What differs from a real kubelet is said here and in docs/testing.md:

- no container image: an image maps to a local environment (a folder whose
  bin/ leads PATH, e.g. a virtualenv) that stands for it; an unmapped image
  fails as a pull does (ErrImagePull);
- no network namespace: each pod gets its own loopback address (127.1.x.y),
  and `0.0.0.0` in its environment and arguments (KubeSpawner binds the
  server to 0.0.0.0:8888) is rewritten to that address;
- no mount namespace: a volume is a host folder (a PV's hostPath, an
  emptyDir under the emulator's state); the mount that holds the
  container's HOME or working folder becomes HOME and the working folder;
- no restarts: a container that ends leaves the pod Succeeded or Failed;
- an image "pull" is a wait of the image's `pull_delay_s` (0 by default), on
  every start (as `imagePullPolicy: Always`), while the pod shows Pending with
  its containers waiting in ContainerCreating; a deletion during it starts
  nothing.

Each container's `startedAt` is the moment its process was exec'd, written as
Kubernetes writes times: to the whole second, truncated (`iso_at`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GPU_RESOURCE_PREFIX = "nvidia.com/"
# Node annotation listing the device IDs behind each GPU resource (JSON
# {resource: [ids]}), as the device plugin would enumerate them.
DEVICES_ANNOTATION = "gpulease.test/devices"
# DRA: the uuids of the devices allocated to the pod's claims, where a real node's
# NVIDIA DRA driver would have its CDI spec put the devices' nodes in the container.
DRA_DEVICES_ENV = "GPULEASE_TEST_DRA_DEVICES"
DEFAULT_HOME = "/home/jovyan"
# In each pod process's environment: which pod it belongs to, so that where no
# cgroup can hold a pod, its processes can still all be found and ended.
POD_MARKER = "GPULEASE_TEST_POD_UID"


class PlanError(Exception):
    """The pod cannot run here: (reason, message) as a kubelet would report them."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        self.message = message
        super().__init__(f"{reason}: {message}")


@dataclass(frozen=True)
class Image:
    """A local stand-in for a container image."""

    prefix: str  # its bin/ leads PATH
    user: int = 0  # the image's USER, for pods that set no runAsUser
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    pull_delay_s: float = 0.0  # how long its "pull" takes, on every start


@dataclass(frozen=True)
class ProcessPlan:
    container: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    uid: int
    gid: int
    groups: list[int]


def iso_at(epoch_s: float) -> str:
    """A moment (seconds since the epoch) as Kubernetes writes it: RFC 3339, UTC, to the
    whole second, truncated (metav1.Time)."""
    return dt.datetime.fromtimestamp(int(epoch_s), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def precise_iso(epoch_s: float) -> str:
    """A moment to the microsecond, for the emulator's own words (its events)."""
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_requests(pod: dict) -> dict[str, int]:
    """How many of each nvidia.com/ resource the pod's containers ask for (limits = requests)."""
    wanted: dict[str, int] = {}
    for container in pod["spec"].get("containers", []):
        resources = container.get("resources", {})
        for name, value in {**resources.get("requests", {}), **resources.get("limits", {})}.items():
            if name.startswith(GPU_RESOURCE_PREFIX):
                wanted[name] = max(wanted.get(name, 0), int(value))
    return wanted


def pick_devices(wanted: dict[str, int], declared: dict[str, list[str]],
                 taken: set[str]) -> dict[str, list[str]]:
    """Concrete device IDs for the pod, none already taken; PlanError when too few are free."""
    chosen: dict[str, list[str]] = {}
    for resource, count in sorted(wanted.items()):
        free = [d for d in declared.get(resource, []) if d not in taken]
        if len(free) < count:
            raise PlanError("UnexpectedAdmissionError",
                            f"Allocate failed due to requested number of devices unavailable "
                            f"for {resource}. Requested: {count}, Available: {len(free)}")
        chosen[resource] = free[:count]
    return chosen


def _field(pod: dict, path: str, pod_ip: str) -> str:
    values = {"metadata.name": pod["metadata"]["name"],
              "metadata.namespace": pod["metadata"]["namespace"],
              "metadata.uid": pod["metadata"]["uid"],
              "spec.nodeName": pod["spec"].get("nodeName", ""),
              "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
              "status.podIP": pod_ip, "status.hostIP": "127.0.0.1"}
    if path not in values:
        raise PlanError("CreateContainerConfigError", f"unsupported fieldRef {path}")
    return values[path]


def container_env(pod: dict, container: dict, pod_ip: str,
                  lookup: Any = None) -> dict[str, str]:
    """The container's declared environment; `lookup(kind, name, key)` reads secrets/configmaps."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "valueFrom" not in item:
            env[item["name"]] = item.get("value", "")
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[item["name"]] = _field(pod, source["fieldRef"]["fieldPath"], pod_ip)
        elif lookup and ("secretKeyRef" in source or "configMapKeyRef" in source):
            kind = "secret" if "secretKeyRef" in source else "configmap"
            ref = source["secretKeyRef" if kind == "secret" else "configMapKeyRef"]
            env[item["name"]] = lookup(kind, ref["name"], ref["key"])
        else:
            raise PlanError("CreateContainerConfigError",
                            f"env {item['name']}: unsupported valueFrom {sorted(source)}")
    return env


def _rewrite_bind(text: str, pod_ip: str) -> str:
    return text.replace("0.0.0.0", pod_ip)


def user_of(pod: dict, container: dict, image: Image) -> tuple[int, int, list[int]]:
    pod_sc = pod["spec"].get("securityContext", {}) or {}
    sc = {**pod_sc, **(container.get("securityContext", {}) or {})}
    uid = int(sc.get("runAsUser", image.user))
    gid = int(sc.get("runAsGroup", uid if uid else 0))
    if sc.get("runAsNonRoot") and uid == 0:
        raise PlanError("CreateContainerConfigError",
                        "container has runAsNonRoot and image will run as root")
    groups = [int(g) for g in pod_sc.get("supplementalGroups", [])]
    if "fsGroup" in pod_sc:
        groups.append(int(pod_sc["fsGroup"]))
    return uid, gid, groups


def plan_container(pod: dict, container: dict, image: Image, pod_ip: str,
                   mounts: dict[str, str], devices: dict[str, list[str]],
                   lookup: Any = None, dra_devices: list[str] | None = None) -> ProcessPlan:
    """The local process standing for one container. `mounts`: mountPath -> host folder."""
    declared = container_env(pod, container, pod_ip, lookup)
    home_in_pod = declared.get("HOME", DEFAULT_HOME)
    workdir = container.get("workingDir") or home_in_pod

    def on_host(path: str) -> str | None:
        for mount_path, host in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
                return host + path[len(mount_path.rstrip("/")):]
        return None

    home = on_host(home_in_pod) or on_host(workdir)
    cwd = on_host(workdir) or home or "/"
    env = {"PATH": f"{image.prefix}/bin:/usr/local/bin:/usr/bin:/bin",
           "HOSTNAME": pod["metadata"]["name"], **image.env}
    env.update({k: _rewrite_bind(v, pod_ip) for k, v in declared.items()})
    if home:
        env["HOME"] = home
    env[POD_MARKER] = pod["metadata"]["uid"]
    ids = [d for resource in sorted(devices) for d in devices[resource]]
    env["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids) if ids else "void"
    if dra_devices is not None:
        env[DRA_DEVICES_ENV] = ",".join(dra_devices)
    argv = list(container.get("command") or image.entrypoint) + list(container.get("args", []))
    if not argv:
        raise PlanError("CreateContainerConfigError", "no command: the image stand-in has no entrypoint")
    uid, gid, groups = user_of(pod, container, image)
    return ProcessPlan(container["name"], [_rewrite_bind(a, pod_ip) for a in argv], env, cwd,
                       uid, gid, groups)


def _started(started: str | dict[str, str], container: str) -> str:
    return started if isinstance(started, str) else started[container]


def creating_status(pod: dict, start_time: str) -> dict:
    """The pod status a kubelet writes once it took the pod, before its containers run
    (pulling their images): Pending, each container waiting in ContainerCreating."""
    statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                 "started": False, "restartCount": 0,
                 "state": {"waiting": {"reason": "ContainerCreating"}}}
                for c in pod["spec"]["containers"]]
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": start_time},
                  {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                   "lastTransitionTime": start_time}]
    return {"phase": "Pending", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": start_time, "conditions": conditions, "containerStatuses": statuses}


def running_status(pod: dict, pod_ip: str, started: str | dict[str, str],
                   image_of: dict[str, str], start_time: str | None = None) -> dict:
    """The pod status a kubelet writes once every container has started (no probes: Ready).
    `started`: each container's startedAt (by name), or one for all; `start_time`: when
    the kubelet took the pod (default: the first container's start)."""
    ready_at = max(_started(started, c["name"]) for c in pod["spec"]["containers"])
    conditions = [{"type": t, "status": "True", "lastTransitionTime": ready_at}
                  for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady",
                            "Ready", "PodScheduled")]
    statuses = [{"name": c["name"], "image": c["image"], "imageID": image_of.get(c["name"], ""),
                 "containerID": f"emulated://{pod['metadata']['uid']}/{c['name']}",
                 "ready": True, "started": True, "restartCount": 0,
                 "state": {"running": {"startedAt": _started(started, c["name"])}}}
                for c in pod["spec"]["containers"]]
    first = min(_started(started, c["name"]) for c in pod["spec"]["containers"])
    return {"phase": "Running", "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": start_time or first, "conditions": conditions,
            "containerStatuses": statuses}


# The kubelet's bounds of a termination message read from a container's log
# (kubernetes pkg/kubelet/container: MaxContainerTerminationMessageLogLines, ...Length).
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


def read_logs(folder: Path, containers: Iterable[str]) -> dict[str, bytes]:
    """What each container wrote (its stdout and stderr: <folder>/<container>.log)."""
    out = {}
    for name in containers:
        try:
            out[name] = (folder / f"{name}.log").read_bytes()
        except OSError:
            pass
    return out


def fallback_message(container: dict, exit_code: int, reason: str, log: bytes) -> str:
    """A container's termination message as the kubelet writes it when its termination
    message file is empty or missing (the emulator has none: a container cannot write
    /dev/termination-log without a mount namespace): under terminationMessagePolicy
    FallbackToLogsOnError, for a container that failed (exit code not 0, reason not
    ContainerCannotRun), the last 80 lines of its log, of which the last 2048 bytes
    (kuberuntime's convertToKubeContainerStatus and readLastStringFromContainerLogs:
    ReadLogs with TailLines into a 2048-byte circular buffer). "" otherwise."""
    if container.get("terminationMessagePolicy") != "FallbackToLogsOnError" or exit_code == 0 \
            or reason == "ContainerCannotRun":
        return ""
    lines = log.splitlines(keepends=True)[-FALLBACK_LOG_LINES:]
    return b"".join(lines)[-FALLBACK_LOG_BYTES:].decode("utf-8", "replace")


def terminated_status(pod: dict, exit_codes: dict[str, int], started: str | dict[str, str],
                      finished: str | dict[str, str],
                      reason_for: dict[str, str] | None = None,
                      logs: dict[str, bytes] | None = None) -> dict:
    """Every container ended: Succeeded if all exited 0, else Failed (no restarts here).
    `started` and `finished`: each container's (by name), or one for all; `logs`: what
    each wrote (its termination message, fallback_message)."""
    statuses = []
    for c in pod["spec"]["containers"]:
        code = exit_codes.get(c["name"], 137)
        reason = (reason_for or {}).get(c["name"]) or ("Completed" if code == 0 else "Error")
        ended = {"exitCode": code, "reason": reason, "startedAt": _started(started, c["name"]),
                 "finishedAt": _started(finished, c["name"])}
        message = fallback_message(c, code, reason, (logs or {}).get(c["name"], b""))
        if message:
            ended["message"] = message
        statuses.append({"name": c["name"], "image": c["image"], "imageID": "",
                         "containerID": f"emulated://{pod['metadata']['uid']}/{c['name']}",
                         "ready": False, "started": False, "restartCount": 0,
                         "state": {"terminated": ended}})
    phase = "Succeeded" if all(s["state"]["terminated"]["exitCode"] == 0 for s in statuses) \
        else "Failed"
    ended = max(_started(finished, c["name"]) for c in pod["spec"]["containers"])
    conditions = [{"type": t, "status": "False", "lastTransitionTime": ended,
                   "reason": "PodCompleted"} for t in ("Ready", "ContainersReady")]
    return {"phase": phase, "conditions": conditions, "containerStatuses": statuses}


def waiting_status(pod: dict, reason: str, message: str) -> dict:
    """A pod that cannot start its containers (image pull, config): Pending, waiting."""
    statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                 "started": False, "restartCount": 0,
                 "state": {"waiting": {"reason": reason, "message": message}}}
                for c in pod["spec"]["containers"]]
    return {"phase": "Pending", "hostIP": "127.0.0.1", "containerStatuses": statuses,
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                            "lastTransitionTime": now_iso()}]}


def failed_admission_status(reason: str, message: str) -> dict:
    """A pod the kubelet refuses to admit (e.g. devices unavailable): Failed at once."""
    return {"phase": "Failed", "reason": reason, "message": message}
