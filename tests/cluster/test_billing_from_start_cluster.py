"""Issue 39 in the cluster shape: billed from the moment a researcher's code can run.

`gpulease up --GPULeaseHub.shape=cluster` on the test control plane; the researcher's
code is a `~/.jupyter/jupyter_server_config.py` in their home (the claim's volume),
loaded by the server in its container before it answers, and noting when it began
(`marks.jsonl`). What each test shows:

- an image pull of PULL_S seconds (the kubelet emulator's delay for the image) is not
  billed: the session starts at the notebook container's `startedAt`, to the second,
  PULL_S after the pod was made;
- a config that works WORK_S seconds before the server answers is billed from the
  container's start (before the config's first line ran), so for at least WORK_S;
- a config that never lets the server answer and ignores SIGTERM, in a pod of 300 s
  grace: at http_timeout its pod is deleted with a grace period of 1 s (the kubelet
  kills it at once; the Pod object, and so its devices and its billing, stay until
  then), the start fails naming why, its session closes `start_failed` at the pod's
  end (its containers' finishedAt, within the second Kubernetes writes it to); a
  config that exits fails its start too; both are counted, and a third start of the
  profile gets 429 with Retry-After;
- an image that cannot be pulled, or a start refused before its pod (credit), is not
  counted: with a limit of one failed start, the next start of that profile is not
  refused, while one exit of the server's code pauses its own profile.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpulease.images import shipped_catalog
from gpulease.spawners.kube.pod_start import k8s_time
from tests.cluster.conftest import POD_UID, ControlPlane
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.stand_ins import map_stand_in, ours
from tests.cluster.test_gpulease_up_cluster import (
    HEARTBEAT,
    PW,
    cluster_hub_at,
    pod_of,
    sessions_of,
    start,
    wait_for,
)
from tests.support.hubproc import HubProcess, password_of

HTTP_TIMEOUT_S = 5  # where a start must fail for want of an answer
SLOW_HTTP_TIMEOUT_S = 30  # where a server works WORK_S before it answers
WORK_S = 4
PULL_S = 4
LIMIT = 2
START_TIMEOUT_S = 30  # the start's whole wait (a pull that fails: JupyterHub's timeout)

MARK = """
import json as _j, os as _o, time as _t
def _note(**kw):
    with open(_o.path.expanduser("~/marks.jsonl"), "a") as f:
        f.write(_j.dumps({**kw, "at": _t.time()}) + "\\n")
_note(event="loaded", pid=_o.getpid())
"""
SLOW_CONFIG = MARK + f"_t.sleep({WORK_S})\n_note(event='worked')\n"
# Never lets the server answer, and ignores SIGTERM (the kubelet's first word)
DEAF_CONFIG = MARK + """
import signal as _s
_s.signal(_s.SIGTERM, _s.SIG_IGN)
while True:
    _t.sleep(1)
"""
# Says why in red, with HTML, then exits: its container's log's end is its termination
# message (FallbackToLogsOnError), which its owner is shown.
GAVE_UP = "CLUSTER-MARK-5e1d: my config gave up on <missing> data"
EXITS_CONFIG = MARK + f"print('\\x1b[31m{GAVE_UP}\\x1b[0m', flush=True)\nraise SystemExit(7)\n"


def catalog_and_profiles(folder: Path, namespace: str) -> tuple[Path, dict]:
    """A catalog with the shipped images and three of this test's own (a slow pull, one
    that cannot be pulled), and a profile of each (a 1g.18gb slice), plus one whose
    minimum run no credit here covers."""
    shipped = [{k: v for k, v in vars(i).items() if v not in (None, {}, "")}
               for i in shipped_catalog().images]
    ours_images = {"slow-pull": f"registry.example.test/{namespace}/slow-pull:1",
                   "no-image": f"registry.example.test/{namespace}/no-such-image:1"}
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"images": shipped + [
        {"name": name, "image": image} for name, image in ours_images.items()]}))
    slice_ = {"gpu": {"model": "H200", "mig": "1g.18gb"}, "cpu": 1, "memory": "2Gi",
              "price_per_hour": "36", "min_run": "1s"}
    profiles = {"profiles": [
        {"slug": "slice", "display_name": "Slice", "images": ["pytorch"], **slice_},
        {"slug": "slice-b", "display_name": "Slice B", "images": ["pytorch"], **slice_},
        {"slug": "slow-pull", "display_name": "Slow pull", "images": ["slow-pull"], **slice_},
        {"slug": "no-image", "display_name": "No image", "images": ["no-image"], **slice_},
        {"slug": "dear", "display_name": "Dear", "images": ["pytorch"],
         **{**slice_, "price_per_hour": "1000000", "min_run": "1h"}},
    ]}
    return catalog, profiles


@pytest.fixture
def hub(request: pytest.FixtureRequest, control_plane: ControlPlane, kube: Kube,
        namespace: str, gpu_nodes, tmp_path: Path) -> Iterator[HubProcess]:
    """The cluster hub: failed_start_limit LIMIT and http_timeout HTTP_TIMEOUT_S, or what
    the test's indirect parameter says ({"limit": N, "http_timeout": S})."""
    asked = getattr(request, "param", {})
    limit, http_timeout = asked.get("limit", LIMIT), asked.get("http_timeout", HTTP_TIMEOUT_S)
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}))
    catalog, profiles = catalog_and_profiles(tmp_path, namespace)
    map_stand_in(control_plane, f"registry.example.test/{namespace}/slow-pull:1", ours(),
                 pull_delay_s=PULL_S)
    with cluster_hub_at(control_plane, kube, namespace, tmp_path, profiles=profiles,
                        config=f"c.GPUKubeSpawner.http_timeout = {http_timeout}\n",
                        extra_args=(
            f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}", "--Spawner.poll_interval=1",
            f"--catalog={catalog}", f"--GPULeaseHub.failed_start_limit={limit}",
            "--GPULeaseHub.failed_start_window=10m",
            f"--GPUKubeSpawner.start_timeout={START_TIMEOUT_S}",
            # a pod whose SIGTERM-ignoring server would keep it 300 s when stopped
            "--GPUKubeSpawner.delete_grace_period=300",
            '--GPUKubeSpawner.extra_pod_config={"terminationGracePeriodSeconds": 300}')) as h:
        yield h


def home(control_plane: ControlPlane, namespace: str) -> Path:
    """The home volume's folder (tests/cluster/test_kubespawner.py home_volume)."""
    return control_plane.root / "volumes" / f"{namespace}-home"


def configure(folder: Path, config: str) -> None:
    """Put `config` in the researcher's home as theirs."""
    jupyter = folder / ".jupyter"
    jupyter.mkdir(exist_ok=True)
    (jupyter / "jupyter_server_config.py").write_text(config)
    (folder / "marks.jsonl").unlink(missing_ok=True)
    if os.geteuid() == 0:
        for path in (jupyter, jupyter / "jupyter_server_config.py"):
            os.chown(path, POD_UID, 100)


def marks(folder: Path) -> dict[str, dict]:
    path = folder / "marks.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {m["event"]: m for m in map(json.loads, filter(str.strip, lines))}


def moment(iso: str) -> dt.datetime:
    """An API time (ISO 8601, Z) as naive UTC, as the pod's times read (pod_start)."""
    return k8s_time(iso)


def epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def closed_session(hub: HubProcess, token: str, count: int, timeout: float = 60) -> dict:
    return wait_for(f"session #{count} closed", lambda: (
        len(found := sessions_of(hub, token)) >= count and found[-1]["ended"] is not None
        and found[-1]), timeout=timeout, hub=hub)


def start_failed(hub: HubProcess, user: str, token: str) -> str:
    """The failed start's message, as the researcher's progress page gets it."""
    r = hub.api("GET", f"users/{user}/server/progress", token)
    events = [json.loads(line[len("data:"):]) for line in r.text.splitlines()
              if line.startswith("data:")]
    failed = [e for e in events if e.get("failed")]
    assert failed, events
    return failed[-1]["message"]


def failed_starts(hub: HubProcess, token: str) -> list[dict]:
    r = hub.service("GET", "api/failed-starts", token)
    assert r.status_code == 200, r.text
    return r.json()["failed_starts"]


def started_at(pod: dict) -> dt.datetime:
    (notebook,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "notebook"]
    return k8s_time(notebook["state"]["running"]["startedAt"])


def stop(hub: HubProcess, kube: Kube, namespace: str, user: str, token: str) -> None:
    assert hub.api("DELETE", f"users/{user}/server", token).status_code in (202, 204)
    hub.wait_server_stopped(user, token, timeout=60)
    wait_for(f"{user}'s pod deleted", lambda: pod_of(kube, namespace, user) is None)


class PodWatch:
    """Every version of `user`'s pod the API server shows from now on (a watch: a status
    the pod has for a moment before it is removed is seen too), until `stop`."""

    def __init__(self, kube: Kube, namespace: str, user: str):
        self.seen: list[dict] = []
        self._done = threading.Event()
        path, name = pods_path(namespace), f"jupyter-{user}"
        listed = kube.get(path)
        version = listed["metadata"]["resourceVersion"]

        def follow() -> None:
            nonlocal version
            while not self._done.is_set():
                for event in kube.watch(path, version, timeout=5,
                                        fieldSelector=f"metadata.name={name}"):
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.seen.append(event["object"])
        self._thread = threading.Thread(target=follow, daemon=True)
        self._thread.start()

    def stop(self) -> list[dict]:
        self._done.set()
        self._thread.join(10)
        return self.seen


@pytest.mark.parametrize("hub", [{"http_timeout": SLOW_HTTP_TIMEOUT_S}], indirect=True,
                         ids=["answers-in-time"])  # JupyterLab on a loaded machine: seconds
def test_an_image_pull_is_not_billed(hub: HubProcess, kube: Kube, namespace: str):
    admin = hub.token_for("admin", PW)
    alice = hub.add_user(admin, "alice", "100")
    assert start(hub, "alice", alice, "slow-pull").status_code in (201, 202)
    hub.wait_server_ready("alice", alice, timeout=PULL_S + 90)
    pod = pod_of(kube, namespace, "alice")
    (session,) = sessions_of(hub, alice)
    created = k8s_time(pod["metadata"]["creationTimestamp"])
    # billed from its container's start, to the second: not from the pod's creation
    assert moment(session["started"]) == started_at(pod), (session, pod["status"])
    assert (moment(session["started"]) - created).total_seconds() >= PULL_S - 1
    events = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    assert "Pulling" in [e["reason"] for e in events]
    stop(hub, kube, namespace, "alice", alice)


@pytest.mark.parametrize("hub", [{"http_timeout": SLOW_HTTP_TIMEOUT_S}], indirect=True,
                         ids=["answers-in-time"])
def test_a_server_that_works_before_it_answers_is_billed_from_its_container_start(
        control_plane: ControlPlane, hub: HubProcess, kube: Kube, namespace: str):
    admin = hub.token_for("admin", PW)
    alice = hub.add_user(admin, "alice", "100")
    folder = home(control_plane, namespace)
    configure(folder, SLOW_CONFIG)
    assert start(hub, "alice", alice, "slice").status_code in (201, 202)
    hub.wait_server_ready("alice", alice, timeout=WORK_S + 90)
    pod = pod_of(kube, namespace, "alice")
    (session,) = sessions_of(hub, alice)
    seen = marks(folder)
    assert moment(session["started"]) == started_at(pod), (session, pod["status"])
    assert epoch(session["started"]) <= seen["loaded"]["at"] < seen["worked"]["at"]
    stop(hub, kube, namespace, "alice", alice)
    session = closed_session(hub, alice, 1)
    # billed while its code worked, before the server answered
    assert session["billed_ms"] >= WORK_S * 1000, session
    assert session["end_reason"] == "user"


def test_a_start_that_never_answers_is_killed_billed_counted_and_rationed(
        control_plane: ControlPlane, hub: HubProcess, kube: Kube, namespace: str):
    admin = hub.token_for("admin", PW)
    alice = hub.add_user(admin, "alice", "100")
    folder = home(control_plane, namespace)
    configure(folder, DEAF_CONFIG)
    watch = PodWatch(kube, namespace, "alice")
    asked = time.monotonic()
    r = start(hub, "alice", alice, "slice")
    assert r.status_code in (202, 504), r.text  # 504: it did not answer
    session = closed_session(hub, alice, 1, timeout=HTTP_TIMEOUT_S + 60)
    took = time.monotonic() - asked
    wait_for("alice's pod gone", lambda: pod_of(kube, namespace, "alice") is None, timeout=30)
    seen = watch.stop()
    assert session["end_reason"] == "start_failed", session
    # killed at http_timeout: its pod deleted with a grace of 1 s, not its 300 s, and not
    # left for JupyterHub's own waits (http_timeout again, then its stop)
    assert seen and seen[0]["spec"]["terminationGracePeriodSeconds"] == 300
    deleting = [p for p in seen if p["metadata"].get("deletionTimestamp")]
    assert deleting and deleting[0]["metadata"]["deletionGracePeriodSeconds"] == 1, deleting[:1]
    assert took < HTTP_TIMEOUT_S + 30, took
    # billed from its container's start to its end: the pod's containers' finishedAt, to
    # the second Kubernetes writes it to
    running = next(p for p in seen if p["status"].get("phase") == "Running")
    assert moment(session["started"]) == started_at(running)
    assert epoch(session["started"]) <= marks(folder)["loaded"]["at"]
    ended = [p for p in seen if p["status"].get("phase") in ("Failed", "Succeeded")]
    assert ended, [p["status"] for p in seen[-3:]]
    (notebook,) = [c for c in ended[-1]["status"]["containerStatuses"]
                   if c["name"] == "notebook"]
    finished = k8s_time(notebook["state"]["terminated"]["finishedAt"])
    assert finished <= moment(session["ended"]) <= finished + dt.timedelta(seconds=1), (
        session, notebook)
    assert session["billed_ms"] >= HTTP_TIMEOUT_S * 1000, session
    message = start_failed(hub, "alice", alice)
    assert f"did not answer within {HTTP_TIMEOUT_S} s of its launch and was killed" \
        in message, message
    assert "start_failed" in message, message
    assert len(failed_starts(hub, alice)) == 1

    # A config that exits fails its start too, billed for what ran, and counted.
    configure(folder, EXITS_CONFIG)
    hub.wait_server_stopped("alice", alice, timeout=30)
    r = start(hub, "alice", alice, "slice")
    assert r.status_code in (202, 502), r.text  # 502: it exited
    session = closed_session(hub, alice, 2)
    assert session["end_reason"] == "start_failed", session
    assert 0 < session["billed_ms"] < 30_000, session
    message = start_failed(hub, "alice", alice)
    assert "exited before it answered (its container exited with status 7)" in message, message
    # ... and what it wrote last, from its container's termination message, stripped
    assert GAVE_UP in message and "\x1b" not in message, message
    hub.wait_server_stopped("alice", alice, timeout=30)
    assert len(failed_starts(hub, alice)) == LIMIT
    page = hub.signed_in("alice", password_of("alice")).get(f"{hub.url}/hub/home", timeout=30)
    assert "Its last start failed" in page.text
    assert GAVE_UP.replace("<missing>", "&lt;missing&gt;") in page.text, page.text[-3000:]
    shown = hub.cli("logs", "alice")  # an admin: the tail, and where the full log is
    assert shown.returncode == 0 and GAVE_UP in shown.stdout, shown
    assert "kubectl logs --namespace" in shown.stderr and "\x1b" not in shown.stdout
    bob = hub.add_user(admin, "bob", "1")
    assert hub.service("GET", "api/logs/alice", bob).status_code == 403

    # Past the limit: refused before anything is made, 429 with when to try again.
    r = start(hub, "alice", alice, "slice")
    assert r.status_code == 429, r.text
    assert f"last {LIMIT} starts failed" in r.json()["message"], r.text
    assert 0 < int(r.headers["Retry-After"]) <= 600
    assert pod_of(kube, namespace, "alice") is None
    assert len(failed_starts(hub, alice)) == LIMIT  # the refusal is not one more


@pytest.mark.parametrize("hub", [{"limit": 1, "http_timeout": SLOW_HTTP_TIMEOUT_S}],
                         indirect=True, ids=["limit-1"])
def test_an_image_pull_failure_or_a_refusal_before_the_pod_is_not_counted(
        control_plane: ControlPlane, hub: HubProcess, kube: Kube, namespace: str):
    admin = hub.token_for("admin", PW)
    alice = hub.add_user(admin, "alice", "100")
    # An image that cannot be pulled: the start fails (JupyterHub's start_timeout), its
    # code never ran: not billed, not counted.
    r = start(hub, "alice", alice, "no-image")
    assert r.status_code in (202, 500, 504), r.text
    hub.wait_server_stopped("alice", alice, timeout=START_TIMEOUT_S + 60)
    wait_for("alice's pod deleted", lambda: pod_of(kube, namespace, "alice") is None)
    # Refused before its pod: not enough credit for the profile's minimum run.
    r = start(hub, "alice", alice, "dear")
    assert r.status_code == 402, r.text
    assert failed_starts(hub, alice) == []
    assert sessions_of(hub, alice) == []
    # With a limit of one, either would have paused its profile: neither did.
    r = start(hub, "alice", alice, "no-image")
    assert r.status_code != 429, r.text
    assert hub.api("DELETE", "users/alice/server", alice).status_code in (202, 204)
    hub.wait_server_stopped("alice", alice, timeout=60)
    # While one exit of the server's own code does pause its profile.
    configure(home(control_plane, namespace), EXITS_CONFIG)
    start(hub, "alice", alice, "slice")
    assert closed_session(hub, alice, 1)["end_reason"] == "start_failed"
    hub.wait_server_stopped("alice", alice, timeout=30)
    assert start(hub, "alice", alice, "slice").status_code == 429
    assert [f["profile"] for f in failed_starts(hub, alice)] == ["slice"]
