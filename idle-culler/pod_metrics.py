"""CPU of a pod (the cluster shape): the metrics API's PodMetrics, or unknown with why.

A server in the cluster shape is a pod; kubespawner's state (which the hub
shows the culler with `admin:server_state`) names it: `pod_name`,
`namespace`. Its CPU is what the metrics server reports in
`metrics.k8s.io/v1beta1` PodMetrics: each container's usage, in cores,
averaged over the metrics server's window (15 s or so). Many clusters run
no metrics server: then the API group is not served (404), and the
reading is unknown, never 0: policy.py lets an unknown signal count
neither as activity nor as quiet.

One list of a namespace's PodMetrics serves all servers of a pass (cached
for `cache_s`). The Kubernetes client is kubernetes_asyncio, configured from
$KUBECONFIG or in-cluster, imported only when this source is used (the
embedded shape has no Kubernetes client). Nothing here decides anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpulease.idle_culler.cpu import CpuReading

GROUP, VERSION = "metrics.k8s.io", "v1beta1"
# What the culler's ServiceAccount needs, in the servers' namespace (a Role; docs/cluster.md).
CULLER_RULES = [{"apiGroups": [GROUP], "resources": ["pods"], "verbs": ["list"]}]
NO_METRICS_SERVER = (f"no metrics server: the cluster does not serve {GROUP}/{VERSION} "
                     "(install metrics-server for a CPU reading)")
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)(n|u|m|k|M|G)?")
_SCALE = {None: 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}


def cpu_cores(quantity: str) -> float:
    """Cores from a Kubernetes CPU quantity as the metrics API writes it: 1234567n, 250m, 2."""
    match = _QUANTITY.fullmatch(str(quantity).strip())
    if match is None:
        raise ValueError(f"{quantity!r} is not a CPU quantity (like 1234567n, 250m or 2)")
    return float(match.group(1)) * _SCALE[match.group(2)]


def pods_percent(body: Any) -> dict[str, float]:
    """{pod name: percent of one core, all its containers} from a PodMetricsList."""
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise ValueError(f"the metrics API answered without `items`: {str(body)[:200]}")
    out: dict[str, float] = {}
    for item in body["items"]:
        name = (item.get("metadata") or {}).get("name")
        if name:
            out[name] = 100.0 * sum(cpu_cores((c.get("usage") or {}).get("cpu", "0"))
                                    for c in item.get("containers") or [])
    return out


def explain_refusal(status: int, body: str | bytes, namespace: str) -> str:
    """Why the metrics API could not be read, from its error answer."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        message = json.loads(body).get("message", "")
    except (ValueError, AttributeError):
        message = body.strip()
    if status == 404:
        return NO_METRICS_SERVER
    if status == 403:
        return (f"forbidden to list pods.{GROUP} in namespace {namespace} (the culler's Role: "
                f"docs/cluster.md): {message[:200]}")
    if status == 503:
        return (f"the metrics API ({GROUP}) is registered but not available (is the metrics "
                f"server running?): {message[:200]}")
    return f"the metrics API answered HTTP {status}: {message[:200]}"


def pod_of(state: dict[str, Any] | None) -> tuple[str, str] | None:
    """(namespace, pod name) of a server from kubespawner's state; None: not a pod."""
    state = state or {}
    pod, namespace = state.get("pod_name"), state.get("namespace")
    if isinstance(pod, str) and pod and isinstance(namespace, str) and namespace:
        return namespace, pod
    return None


async def default_api_client() -> Any:
    """A kubernetes_asyncio ApiClient: in-cluster inside a pod, else from $KUBECONFIG."""
    from kubernetes_asyncio import client, config

    # A configuration of its own, and $KUBECONFIG read now: kubernetes_asyncio reads
    # it once, when first imported, and keeps one process-wide default configuration.
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                      client_configuration=configuration,
                                      persist_config=False)
    return client.ApiClient(configuration)


class PodMetricsCpuSource:
    """The cluster shape's CpuSource: a pod's usage from metrics.k8s.io, per namespace."""

    def __init__(self, api_client: Callable[[], Awaitable[Any]] = default_api_client, *,
                 timeout_s: float = 5.0, cache_s: float = 5.0) -> None:
        self._make_client = api_client
        self._api: Any = None
        self.timeout_s, self.cache_s = timeout_s, cache_s
        # namespace -> (when listed, {pod: percent}, why unknown)
        self._lists: dict[str, tuple[float, dict[str, float], str]] = {}
        self._lock = asyncio.Lock()

    async def read(self, key: tuple[str, str], state: dict[str, Any] | None) -> CpuReading:
        pod = pod_of(state)
        if pod is None:
            return CpuReading(None, "no server state (needs admin:server_state)"
                              if state is None else "no pod_name and namespace in its state")
        namespace, name = pod
        percents, error = await self._namespace(namespace)
        if error:
            return CpuReading(None, error)
        if name not in percents:
            return CpuReading(None, f"no PodMetrics for pod {namespace}/{name} yet (the metrics "
                                    "server measures a pod some seconds after it starts)")
        return CpuReading(percents[name])

    async def _namespace(self, namespace: str) -> tuple[dict[str, float], str]:
        async with self._lock:  # one list per namespace and pass, however many servers
            listed = self._lists.get(namespace)
            if listed is None or time.monotonic() - listed[0] >= self.cache_s:
                listed = (time.monotonic(), *await self._list(namespace))
                self._lists[namespace] = listed
            return listed[1], listed[2]

    async def _list(self, namespace: str) -> tuple[dict[str, float], str]:
        try:
            from kubernetes_asyncio import client
            from kubernetes_asyncio.config import ConfigException
        except ImportError:
            return {}, "no Kubernetes client: kubernetes_asyncio is not installed"
        try:
            if self._api is None:
                self._api = await self._make_client()
            body = await client.CustomObjectsApi(self._api).list_namespaced_custom_object(
                GROUP, VERSION, namespace, "pods", _request_timeout=self.timeout_s)
            return pods_percent(body), ""
        except client.ApiException as e:
            return {}, explain_refusal(e.status or 0, e.body or e.reason or "", namespace)
        except ConfigException as e:
            return {}, f"no Kubernetes client configuration (in-cluster or $KUBECONFIG): {e}"
        except Exception as e:  # the API server unreachable, timing out, or garbage
            return {}, f"the API server could not be read: {type(e).__name__}: {e}"[:300]

    def forget(self, keep: set[tuple[str, str]]) -> None:
        pass  # nothing per server: the lists are per namespace and expire

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None
