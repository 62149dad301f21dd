"""ClusterWatch: the cluster inventory kept current from the API server (a thin adapter).

Two watches (list, then watch from that list's resourceVersion) hold the
cluster's Nodes and its Pods in every namespace: pods outside gpulease take
GPUs too, and the inventory must count them. `inventory()` turns what they
hold into the pure ClusterInventory (gpulease/core/capacity/cluster_inventory.py) that
admission decides on; it is rebuilt only after a change.

A watch here never gives up: a failed list or watch is tried again after a
pause that grows to 30 s, a 410 Gone (its resourceVersion compacted away)
lists afresh, and `stale` is True while a watch is not running, so that
admission can say so rather than decide on an old picture. (kubespawner's
reflector, which keys objects by namespace and so cannot hold Nodes, gives
up after about 50 s of failures; GPUKubeSpawner restarts its own.)

In DRA mode (`dra` given) two more watches hold NVIDIA's ResourceSlices and
every namespace's ResourceClaims, and the inventory is the DRA one
(gpulease/core/capacity/dra_inventory.py): devices from the slices, holds from
the allocated claims, holders from the pods.

Needs `list` and `watch` on nodes and pods cluster-wide, nothing else
(CLUSTER_RULES; the ClusterRole in docs/cluster.md); in DRA mode also on
resourceslices and resourceclaims (DRA_CLUSTER_RULES): claims of every
namespace hold devices, as pods of every namespace do.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes_asyncio import client, watch

from gpulease.core.capacity.cluster_inventory import (
    ClusterInventory,
    hold_from_pod,
    node_from_object,
)
from gpulease.core.capacity.dra_inventory import dra_inventory

log = logging.getLogger("gpulease.cluster")
# What the watches need, cluster-wide (a ClusterRole; docs/cluster.md).
# Each rule is needed: tests/cluster/test_cluster_watch.py removes each in turn.
CLUSTER_RULES = [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]}]
DRA_CLUSTER_RULES = [{"apiGroups": ["resource.k8s.io"],
                      "resources": ["resourceslices", "resourceclaims"],
                      "verbs": ["list", "watch"]}]
PAUSES_S = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # then 30 s each time
WATCH_TIMEOUT_S = 300  # the API server ends a watch after this; it is started again


class ObjectWatch:
    """One kind of object (nodes, or pods of every namespace), listed then watched."""

    def __init__(self, kind: str, api: client.CoreV1Api,
                 on_change: Callable[[], None] = lambda: None,
                 on_object: Callable[[dict], None] | None = None,
                 lister: Callable | None = None):
        self.kind = kind
        self.api = api
        # the list call (watched with watch=True): nodes and pods by default
        self._list_call = lister or (api.list_node if kind == "nodes"
                                     else api.list_pod_for_all_namespaces)
        self.objects: dict[str, dict] = {}  # namespace/name (name for nodes) -> object
        self.version = 0  # counts the changes seen, for the inventory's cache
        self.running = False  # listed, and watching
        self.failures = 0  # lists and watches that failed (tests, metrics)
        self.last_error = ""  # why the last one failed, for a refusal to name
        self._on_change = on_change
        self._on_object = on_object  # each object listed, added or changed
        self._task: asyncio.Task | None = None
        self.first_list: asyncio.Future = asyncio.get_running_loop().create_future()

    def _lister(self):
        return self._list_call

    @staticmethod
    def key(obj: dict) -> str:
        meta = obj["metadata"]
        return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.running = False

    async def _list(self) -> str:
        response = await self._lister()(_preload_content=False)
        body = json.loads(await response.read())
        if response.status != 200:
            raise client.ApiException(status=response.status, reason=body.get("message", ""))
        self.objects = {self.key(o): o for o in body["items"]}
        if self._on_object is not None:
            for obj in body["items"]:
                self._on_object(obj)
        self._changed()
        if not self.first_list.done():
            self.first_list.set_result(None)
        return body["metadata"]["resourceVersion"]

    def _changed(self) -> None:
        self.version += 1
        self._on_change()

    async def _run(self) -> None:
        pause = 0
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list()
                self.running = True
                pause = 0
                stream = watch.Watch().stream(partial(self._lister(), _preload_content=False),
                                              resource_version=version,
                                              timeout_seconds=WATCH_TIMEOUT_S,
                                              allow_watch_bookmarks=True)
                async with stream as events:
                    async for event in events:
                        version = self._apply(event) or version
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.running = False
                self.failures += 1
                self.last_error = f"{self.kind}: {_why(e)}"
                gone = isinstance(e, client.ApiException) and e.status == 410
                version = None  # list afresh: what happened meanwhile is not in any event
                wait = 0 if gone else PAUSES_S[min(pause, len(PAUSES_S) - 1)]
                pause += 1
                log.warning("the %s watch failed (%s: %s); listing again in %s s", self.kind,
                            type(e).__name__, e, wait)
                await asyncio.sleep(wait)

    def _apply(self, event: dict[str, Any]) -> str | None:
        kind, obj = event.get("type"), event.get("raw_object") or {}
        if kind == "ERROR":  # the API server's Status, e.g. 410 Gone: list again
            raise client.ApiException(status=obj.get("code", 500), reason=obj.get("message"))
        version = obj.get("metadata", {}).get("resourceVersion")
        if kind == "BOOKMARK":
            return version
        if kind == "DELETED":
            self.objects.pop(self.key(obj), None)
        else:
            self.objects[self.key(obj)] = obj
            if self._on_object is not None:
                self._on_object(obj)
        self._changed()
        return version


def _why(e: Exception) -> str:
    if isinstance(e, client.ApiException):
        return f"HTTP {e.status} {e.reason or ''}".strip()
    return f"{type(e).__name__}: {e}"


class ClusterWatch:
    """Nodes and pods (and in DRA mode slices and claims), watched; `inventory()` the
    ClusterInventory they make."""

    def __init__(self, api: client.CoreV1Api, on_change: Callable[[], None] | None = None,
                 servers_namespace: str | None = None,
                 on_pod: Callable[[dict], None] | None = None,
                 dra: client.ResourceV1Api | None = None):
        notify = on_change or (lambda: None)
        self.servers_namespace = servers_namespace  # gpulease's pods: only there (hold_from_pod)
        self.nodes = ObjectWatch("nodes", api, notify)
        self.pods = ObjectWatch("pods", api, notify, on_pod)
        self.slices: ObjectWatch | None = None
        self.claims: ObjectWatch | None = None
        if dra is not None:
            self.slices = ObjectWatch("resourceslices", api, notify,
                                      lister=dra.list_resource_slice)
            self.claims = ObjectWatch("resourceclaims", api, notify,
                                      lister=dra.list_resource_claim_for_all_namespaces)
        self._cached: tuple[tuple[int, ...], ClusterInventory] | None = None

    @property
    def watches(self) -> list[ObjectWatch]:
        return [w for w in (self.nodes, self.pods, self.slices, self.claims) if w is not None]

    async def start(self, timeout: float = 60) -> None:
        """Start the watches; return once each listed (TimeoutError after `timeout` s)."""
        for w in self.watches:
            w.start()
        await asyncio.wait_for(asyncio.gather(*(w.first_list for w in self.watches)), timeout)

    @property
    def stale(self) -> bool:
        """True while any watch is not running (failed, listing again)."""
        return not all(w.running for w in self.watches)

    def inventory(self) -> ClusterInventory:
        """The inventory as the watches see it now (rebuilt only after a change)."""
        key = tuple(w.version for w in self.watches)
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, self._build())
        return self._cached[1]

    def _build(self) -> ClusterInventory:
        if self.slices is not None and self.claims is not None:
            return dra_inventory(self.nodes.objects.values(), self.slices.objects.values(),
                                 self.claims.objects.values(), self.pods.objects.values(),
                                 self.servers_namespace)
        holds = tuple(h for h in (hold_from_pod(p, self.servers_namespace)
                                  for p in self.pods.objects.values()) if h is not None)
        nodes = tuple(node_from_object(n) for n in self.nodes.objects.values())
        return ClusterInventory(nodes, holds)

    async def stop(self) -> None:
        for w in self.watches:
            await w.stop()
