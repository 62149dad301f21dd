"""ClusterSource: the cluster inventory that `api/inventory` shows, listed from the API server.

The gpulease service runs in the cluster shape when `GPULEASE_CLUSTER_NAMESPACE`
is set (`gpulease up` sets it, and passes `KUBECONFIG` through). This thin
adapter is its only Kubernetes I/O: it lists the Nodes and the live Pods of
every namespace (in pages, so 1,000 nodes are a few requests) and makes them
the pure ClusterInventory (gpulease/core/capacity/cluster_inventory.py) with the same
functions the spawner's ClusterWatch uses; in DRA mode (GPULEASE_CLUSTER_NODES
`allocation: dra`) also NVIDIA's ResourceSlices and every namespace's
ResourceClaims, made the DRA inventory (gpulease/core/capacity/dra_inventory.py),
whose rows show each device and its holder. A listing is kept for
`cache_s` seconds, and concurrent requests share one listing, so that page
reloads do not list the whole cluster each time. It needs only `list` on
nodes and pods cluster-wide (part of CLUSTER_RULES, docs/cluster.md), and in DRA
mode on resourceslices and resourceclaims (part of DRA_CLUSTER_RULES).

An API server that cannot be reached is a 503, one that refuses gpulease's
credentials (401) or rights (403) or fails (5xx) a 502, each naming the
cause: never a bare 500. A failure is not cached: the next request tries again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpulease.core.capacity.cluster_inventory import (
    ClusterInventory,
    hold_from_pod,
    node_from_object,
    select_nodes,
)
from gpulease.core.capacity.dra_inventory import dra_inventory
from gpulease.core.refusal import Refusal

CACHE_S = 3.0  # how long one listing answers api/inventory and the page
PAGE_SIZE = 500  # objects per list request (the API server's `limit`)
REQUEST_TIMEOUT_S = 15.0  # per list request
# Pods that ended hold nothing; the API server leaves them out of the list.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
RIGHTS = ("the gpulease service's Kubernetes account needs list on nodes and pods "
          "cluster-wide, and in DRA mode on resourceslices and resourceclaims (the "
          "inventory's ClusterRole, docs/cluster.md)")


@dataclass(frozen=True)
class Listed:
    """One listing of the cluster: its inventory, and when it was listed (UTC)."""

    inventory: ClusterInventory
    at: datetime


class ClusterSource:
    """The cluster's inventory, listed on demand and kept `cache_s` seconds."""

    def __init__(self, namespace: str, kubeconfig: str = "", *, cache_s: float = CACHE_S,
                 clock: Callable[[], float] = time.monotonic):
        self.namespace = namespace  # the users' namespace (where gpulease's pods are)
        self.kubeconfig = kubeconfig  # "" : the in-cluster configuration
        self.cache_s = cache_s
        self.listings = 0  # how many listings were made (tests: the cache)
        self._clock = clock
        self._api: Any = None  # kubernetes_asyncio CoreV1Api, made at the first use
        self._host = ""
        self._cached: tuple[float, Listed] | None = None
        self._lock: asyncio.Lock | None = None
        # The spawner's nodes (GPULEASE_CLUSTER_NODES): what availability counts.
        self.node_selector: dict[str, str] = {}
        self.tolerations: list[dict[str, str]] = []
        self.dra = False  # GPUs through DRA: devices from slices, holds from claims

    def spawner_nodes(self, inventory: ClusterInventory) -> ClusterInventory:
        """Only the nodes the spawner admits GPU starts to (every hold stays)."""
        return select_nodes(inventory, self.node_selector, self.tolerations)

    async def listed(self) -> Listed:
        """The inventory as listed at most `cache_s` ago; a Refusal (502/503) naming why not."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one listing at a time; the waiters take its answer
            if self._cached and self._clock() - self._cached[0] < self.cache_s:
                return self._cached[1]
            api = await self._core()
            nodes = await self._list_all("nodes", api.list_node)
            pods = await self._list_all("pods", api.list_pod_for_all_namespaces,
                                        field_selector=LIVE_PODS)
            if self.dra:
                from kubernetes_asyncio import client

                resource = client.ResourceV1Api(api.api_client)
                slices = await self._list_all("resourceslices", resource.list_resource_slice)
                claims = await self._list_all(
                    "resourceclaims", resource.list_resource_claim_for_all_namespaces)
                inventory = dra_inventory(nodes, slices, claims, pods, self.namespace)
            else:
                inventory = ClusterInventory(
                    tuple(node_from_object(n) for n in nodes),
                    tuple(h for h in (hold_from_pod(p, self.namespace) for p in pods)
                          if h is not None))
            self.listings += 1
            listed = Listed(inventory, datetime.now(UTC))
            self._cached = (self._clock(), listed)
            return listed

    async def close(self) -> None:
        if self._api is not None:
            await self._api.api_client.close()
            self._api = None

    async def _core(self) -> Any:
        if self._api is not None:
            return self._api
        # Imported here: the embedded shape's service never loads the Kubernetes client.
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        try:
            if self.kubeconfig:
                await config.load_kube_config(config_file=self.kubeconfig,
                                              client_configuration=configuration,
                                              persist_config=False)
            else:
                config.load_incluster_config(client_configuration=configuration)
        except (config.ConfigException, OSError, ValueError) as e:
            where = f"KUBECONFIG {self.kubeconfig}" if self.kubeconfig else (
                "the in-cluster configuration (no KUBECONFIG is set)")
            raise Refusal(f"The cluster inventory is unknown: gpulease cannot read {where}: "
                          f"{e}", status=503) from None
        self._host = configuration.host
        self._api = client.CoreV1Api(client.ApiClient(configuration))
        return self._api

    async def _list_all(self, what: str, lister: Callable, **query: Any) -> list[dict]:
        import aiohttp  # the Kubernetes client's transport

        items: list[dict] = []
        token = ""
        while True:
            try:
                response = await lister(limit=PAGE_SIZE, _continue=token or None,
                                        _preload_content=False,
                                        _request_timeout=REQUEST_TIMEOUT_S, **query)
                raw = await response.read()
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                cause = f"{type(e).__name__}: {str(e) or 'no answer in time'}"
                raise Refusal(f"The Kubernetes API server at {self._host} cannot be reached "
                              f"to list {what} ({cause}); the cluster inventory is unknown "
                              "until it answers. Try again in a minute.", status=503) from None
            body = _json(raw)
            if response.status != 200:
                raise refused(what, response.status, body.get("message") or
                              raw.decode("utf-8", "replace")[:200])
            items += body.get("items") or []
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                return items


def refused(what: str, status: int, message: str) -> Refusal:
    """The API server's error answer to a list of `what`, as gpulease's 502."""
    if status in (401, 403):
        why = ("refused gpulease's credentials" if status == 401
               else "forbids gpulease to list " + what)
        return Refusal(f"The Kubernetes API server {why} ({status}: {message}): {RIGHTS}.",
                       status=502)
    return Refusal(f"The Kubernetes API server did not list {what} ({status}: {message}); "
                   "the cluster inventory is unknown until it does. Try again in a minute.",
                   status=502)


def _json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def source_from_env(env: dict[str, str]) -> ClusterSource | None:
    """The cluster shape's source when `GPULEASE_CLUSTER_NAMESPACE` is set; else None.
    `GPULEASE_CLUSTER_NODES` (JSON): the spawner's node selector and GPU tolerations."""
    namespace = env.get("GPULEASE_CLUSTER_NAMESPACE", "").strip()
    if not namespace:
        return None
    source = ClusterSource(namespace, env.get("KUBECONFIG", ""))
    nodes = json.loads(env.get("GPULEASE_CLUSTER_NODES") or "{}")
    source.node_selector = dict(nodes.get("node_selector") or {})
    source.tolerations = [dict(t) for t in nodes.get("tolerations") or ()]
    source.dra = nodes.get("allocation") == "dra"
    return source
