"""The fault proxy (tests/cluster/faults.py) breaks exactly the requests it is told to."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.cluster.conftest import ControlPlane
from tests.cluster.faults import Fault, FaultProxy
from tests.cluster.kube import Kube, KubeError
from tests.cluster.rbac import grant, service_account_token


@pytest.fixture
def proxied(control_plane: ControlPlane, kube: Kube,
            namespace: str) -> Iterator[tuple[FaultProxy, Kube]]:
    """A ServiceAccount with namespace admin rights, reaching the API server through the proxy."""
    token = service_account_token(kube, namespace, "sa", seconds=600)
    grant(kube, namespace, "sa", cluster_role="admin")
    pki = control_plane.root / "pki"
    proxy = FaultProxy(control_plane.state["server"], control_plane.state["ca"],
                       str(pki / "apiserver.crt"), str(pki / "apiserver.key")).start()
    client = Kube(proxy.url, pki / "ca.crt", token=token)
    client.wait_for("the RoleBinding to apply",
                    lambda: client.get(f"/api/v1/namespaces/{namespace}/configmaps"))
    yield proxy, client
    proxy.stop()


def _configmap(name: str) -> dict:
    return {"metadata": {"name": name}, "data": {"k": "v"}}


def test_statuses_are_injected_as_many_times_as_asked(proxied, namespace: str):
    proxy, client = proxied
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    proxy.add(Fault("POST", r"/configmaps$", status=500, times=2))
    for _ in range(2):
        with pytest.raises(KubeError) as broken:
            client.create(path, _configmap("a"))
        assert broken.value.status == 500 and broken.value.reason == "InternalError"
    assert client.create(path, _configmap("a"))["metadata"]["name"] == "a"  # then it passes
    proxy.add(Fault("POST", r"/configmaps$", status=409))
    with pytest.raises(KubeError) as conflict:
        client.create(path, _configmap("b"))
    assert conflict.value.status == 409 and conflict.value.reason == "AlreadyExists"
    with pytest.raises(KubeError):  # nothing was created behind the injected 409
        client.get(f"{path}/b")


def test_watches_are_dropped_expired_and_slowed(proxied, namespace: str):
    proxy, client = proxied
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    version = client.get(path)["metadata"]["resourceVersion"]
    proxy.add(Fault("GET", r"watch=1", drop_after=1.0))
    started = time.monotonic()
    events = list(client.watch(path, version, timeout=30))  # ends when the proxy cuts it
    assert time.monotonic() - started < 10
    assert all(e["type"] == "BOOKMARK" for e in events)
    proxy.add(Fault("GET", r"watch=1", expire_watch=True))
    (event,) = list(client.watch(path, version, timeout=30))
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    proxy.add(Fault("GET", r"/configmaps$", delay=1.5))
    started = time.monotonic()
    client.get(path)
    assert time.monotonic() - started >= 1.5
