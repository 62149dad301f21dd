"""ClusterSource (hub/service/cluster_source.py), api/inventory's cluster form and its page rows.

The adapter is run against a stand-in Kubernetes API server (a tornado app on
loopback answering only the two list requests, in pages, or refusing them):
a named test double, for the faults and the cache. The real API server is
in tests/cluster/test_cluster_inventory_api.py.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from tornado import httpserver, web
from tornado.testing import bind_unused_port

from gpulease.core.refusal import Refusal
from gpulease.hub.service.cluster_source import ClusterSource, source_from_env
from gpulease.hub.service.pages import forms as af
from gpulease.hub.service.views import cluster_inventory_view

NODE = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200",
                                              "nvidia.com/mig.strategy": "mixed",
                                              "nvidia.com/cuda.driver-version.full": "570.1"}},
        "spec": {}, "status": {"allocatable": {"nvidia.com/mig-1g.18gb": "7", "cpu": "64"},
                               "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, count: int, user: str = "", server: str = "") -> dict:
    return {"metadata": {"name": name, "namespace": "ns",
                         "labels": {"hub.jupyter.org/username": user} if user else {},
                         "annotations": {"hub.jupyter.org/servername": server} if user else {}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/mig-1g.18gb": str(count)}}}]},
            "status": {"phase": "Running"}}


class StandIn:
    """A stand-in API server: nodes and pods one object a page, or `status` for every list."""

    def __init__(self, nodes: list[dict], pods: list[dict]):
        self.objects = {"/api/v1/nodes": nodes, "/api/v1/pods": pods}
        self.status = 200
        self.requests: list[str] = []

    def handler(self) -> type[web.RequestHandler]:
        stand_in = self

        class ListHandler(web.RequestHandler):
            def get(self, _kind: str):
                stand_in.requests.append(self.request.uri)
                self.set_header("Content-Type", "application/json")
                if stand_in.status != 200:
                    self.set_status(stand_in.status)
                    self.finish({"kind": "Status", "code": stand_in.status,
                                 "message": f'nodes is forbidden: User "system:serviceaccount:'
                                            f'ns:x" cannot list resource "{self.request.path}"'})
                    return
                items = stand_in.objects[self.request.path]
                at = int(self.get_argument("continue", "0") or 0)
                more = {"continue": str(at + 1)} if at + 1 < len(items) else {}
                self.finish({"items": items[at:at + 1],
                             "metadata": {"resourceVersion": "1", **more}})
        return ListHandler


@pytest.fixture
async def stand_in(tmp_path: Path):
    api = StandIn([NODE], [pod("jupyter-ada--train", 2, "ada", "train"), pod("theirs", 1)])
    sock, port = bind_unused_port()
    server = httpserver.HTTPServer(web.Application([(r"/api/v1/(nodes|pods)", api.handler())]))
    server.add_sockets([sock])
    api.kubeconfig = kubeconfig(tmp_path, f"http://127.0.0.1:{port}")
    yield api
    server.stop()


def kubeconfig(folder: Path, server: str) -> str:
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": server}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    return str(path)


def test_the_cluster_shape_is_chosen_by_the_namespace_variable():
    assert source_from_env({}) is None
    assert source_from_env({"GPULEASE_CLUSTER_NAMESPACE": " "}) is None
    source = source_from_env({"GPULEASE_CLUSTER_NAMESPACE": "lab", "KUBECONFIG": "/k"})
    assert (source.namespace, source.kubeconfig) == ("lab", "/k")
    assert source_from_env({"GPULEASE_CLUSTER_NAMESPACE": "lab"}).kubeconfig == ""  # in-cluster


async def test_lists_every_page_and_keeps_one_listing_for_a_few_seconds(stand_in: StandIn):
    now = [100.0]
    source = ClusterSource("ns", stand_in.kubeconfig, cache_s=3, clock=lambda: now[0])
    try:
        listed = await source.listed()
        (node,) = listed.inventory.rows()
        (row,) = node["resources"]
        assert row == {"resource": "nvidia.com/mig-1g.18gb", "allocatable": 7, "free": 4,
                       "holders": [{"user": "ada", "server": "train",
                                    "tier": "on-demand", "count": 2},
                                   {"pod": "ns/theirs", "count": 1}]}
        assert sum("/pods" in r for r in stand_in.requests) == 2  # two pages (continue)
        assert all("fieldSelector=status.phase" in r for r in stand_in.requests if "/pods" in r)
        now[0] += 2.9
        assert await source.listed() is listed and source.listings == 1
        now[0] += 0.2  # the cache is over: listed afresh
        assert (await source.listed()) is not listed and source.listings == 2
    finally:
        await source.close()


async def test_a_user_label_in_another_namespace_shows_as_that_pod_not_the_user(
        stand_in: StandIn):
    """Attack: a pod in another namespace labelled as ada's server is shown as its own pod,
    not hidden as ada's (only the servers' namespace holds gpulease's pods)."""
    forged = pod("forged", 1, "ada", "")
    forged["metadata"]["namespace"] = "batch"
    stand_in.objects["/api/v1/pods"].append(forged)
    source = ClusterSource("ns", stand_in.kubeconfig)
    try:
        (node,) = (await source.listed()).inventory.rows()
        holders = node["resources"][0]["holders"]
        assert {"pod": "batch/forged", "count": 1} in holders
        assert [h for h in holders if h.get("user")] == [
            {"user": "ada", "server": "train", "tier": "on-demand", "count": 2}]
    finally:
        await source.close()


@pytest.mark.parametrize("status, says", [
    (403, "forbids gpulease to list nodes (403: nodes is forbidden"),
    (401, "refused gpulease's credentials (401"),
    (500, "did not list nodes (500"),
])
async def test_an_api_server_that_refuses_is_a_502_naming_why(stand_in: StandIn, status: int,
                                                              says: str):
    stand_in.status = status
    source = ClusterSource("ns", stand_in.kubeconfig)
    try:
        with pytest.raises(Refusal) as refused:
            await source.listed()
        assert refused.value.status == 502 and says in refused.value.message
        if status in (401, 403):
            assert "needs list on nodes and pods cluster-wide" in refused.value.message
        stand_in.status = 200  # a failure is not kept: the next request lists
        assert (await source.listed()).inventory.nodes[0].name == "n1"
    finally:
        await source.close()


async def test_an_api_server_away_is_a_503_and_a_bad_kubeconfig_names_it(tmp_path: Path):
    sock, port = bind_unused_port()
    sock.close()  # nothing listens there
    away = ClusterSource("ns", kubeconfig(tmp_path, f"http://127.0.0.1:{port}"))
    with pytest.raises(Refusal) as refused:
        await away.listed()
    await away.close()
    assert refused.value.status == 503
    assert f"API server at http://127.0.0.1:{port} cannot be reached to list nodes" in str(
        refused.value)
    missing = ClusterSource("ns", str(tmp_path / "none"))
    with pytest.raises(Refusal) as refused:
        await missing.listed()
    assert refused.value.status == 503 and f"KUBECONFIG {tmp_path / 'none'}" in str(refused.value)


async def test_the_cluster_form_and_its_page_tables(stand_in: StandIn):
    source = ClusterSource("ns", stand_in.kubeconfig)
    listed = await source.listed()
    await source.close()
    at = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC)
    view = cluster_inventory_view(listed.inventory, at, "ns")
    assert {k: view[k] for k in ("shape", "namespace", "listed_at", "queue")} == {
        "shape": "cluster", "namespace": "ns", "listed_at": "2026-03-01T12:00:05Z", "queue": []}
    assert view["nodes"][0] | {"resources": None} == {
        "name": "n1", "model": "H200", "mig_strategy": "mixed", "driver": "570.1",
        "schedulable": True, "resources": None}
    json.dumps(view)  # plain JSON
    (table,) = af.cluster_node_tables(view)
    assert table["rows"] == [{"resource": "nvidia.com/mig-1g.18gb", "allocatable": 7, "free": 4,
                              "holders": ["ada/train ×2", "ns/theirs (not gpulease's) ×1"]}]
    default = {**view, "nodes": [{**view["nodes"][0], "model": None, "schedulable": False,
                                  "resources": [{"resource": "nvidia.com/gpu", "allocatable": 1,
                                                 "free": 0, "holders": [
                                                     {"user": "bo", "server": "", "count": 1}]}]}]}
    (table,) = af.cluster_node_tables(default)
    assert table["rows"][0]["holders"] == ["bo/(default) ×1"]
    assert (table["model"], table["schedulable"]) == ("(no GPU model)", False)


def test_both_forms_are_what_docs_rest_api_yml_says():
    import jsonschema

    from gpulease.core.capacity.cluster_inventory import ClusterInventory, Hold, node_from_object
    from gpulease.core.model.inventory import parse_declared_inventory
    from gpulease.hub.service.views import inventory_view

    doc = yaml.safe_load((Path(__file__).resolve().parents[3] / "docs" / "rest-api.yml").read_text())
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/Inventory", "components": doc["components"]})
    inventory = ClusterInventory((node_from_object(NODE),), (
        Hold("ns/jupyter-ada", "n1", {"nvidia.com/mig-1g.18gb": 1}, "ada", ""),
        Hold("ns/theirs", "n1", {"nvidia.com/mig-1g.18gb": 1})))
    cluster = cluster_inventory_view(inventory, datetime.now(UTC), "ns")
    validator.validate(cluster)
    embedded = inventory_view(parse_declared_inventory({"nodes": [{"name": "local", "gpus": [
        {"model": "H200", "mig": ["1g.18gb"]}]}]}, "x"), {})
    validator.validate(embedded)
    assert embedded["shape"] == "embedded"
    # the forms are told apart: neither passes as the other
    for view, other in ((cluster, "embedded"), (embedded, "cluster")):
        assert not validator.is_valid({**view, "shape": other})


def test_the_cli_prints_the_cluster_form(capsys):
    from types import SimpleNamespace

    from gpulease.core.capacity.cluster_inventory import ClusterInventory, Hold, node_from_object
    from gpulease.hub.cli.commands import cmd_inventory

    cordoned = {**NODE, "spec": {"unschedulable": True}}
    view = cluster_inventory_view(ClusterInventory((node_from_object(cordoned),), (
        Hold("ns/jupyter-ada", "n1", {"nvidia.com/mig-1g.18gb": 2}, "ada", ""),
        Hold("ns/theirs", "n1", {"nvidia.com/mig-1g.18gb": 1}))),
        datetime(2026, 3, 1, tzinfo=UTC), "lab")

    class Answers:  # stands in for HubClient: the one call cmd_inventory makes
        def call(self, method: str, path: str):
            assert (method, path) == ("GET", "api/inventory")
            return view
    assert cmd_inventory(Answers(), SimpleNamespace(json=False)) == 0
    out = capsys.readouterr().out
    assert "servers in namespace lab" in out and "NOT SCHEDULABLE" in out
    assert "nvidia.com/mig-1g.18gb       4/7 free  held by ada/(default) x2, ns/theirs x1" in out


def test_the_dra_form_lists_each_device_with_its_holder_as_the_docs_say():
    import jsonschema

    from gpulease.core.capacity.dra_inventory import dra_inventory
    from tests.cluster.dra_driver import node_slice
    from tests.cluster.nodes import GpuNode, node_object

    spec = GpuNode("n1", mig={"1g.18gb": 2}, dra=True)
    node = node_object(spec)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    one = node_slice(spec)
    first = one["spec"]["devices"][0]
    pod = {"metadata": {"name": "jupyter-ada", "namespace": "ns", "uid": "u1",
                        "annotations": {"hub.jupyter.org/username": "ada",
                                        "hub.jupyter.org/servername": "train"}},
           "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    claim = {"metadata": {"name": "jupyter-ada-gpus-x", "namespace": "ns"},
             "status": {"reservedFor": [{"resource": "pods", "name": "jupyter-ada", "uid": "u1"}],
                        "allocation": {"devices": {"results": [
                            {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "n1",
                             "device": first["name"]}]}}}}
    view = cluster_inventory_view(dra_inventory([node], [one], [claim], [pod], "ns"),
                                  datetime(2026, 3, 1, tzinfo=UTC), "ns")
    doc = yaml.safe_load((Path(__file__).resolve().parents[3] / "docs" / "rest-api.yml").read_text())
    jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/Inventory", "components": doc["components"]}
    ).validate(view)
    (table,) = af.cluster_node_tables(view)
    assert table["mig_strategy"] == "dra"
    assert table["rows"] == [{"resource": "nvidia.com/mig-1g.18gb", "allocatable": 2, "free": 1,
                              "holders": ["ada/train ×1"]}]
    uuid = first["attributes"]["uuid"]["string"]
    assert [(d["uuid"] == uuid, d["what"], d["holder"]) for d in table["devices"]] == [
        (True, "MIG 1g.18gb", "ada/train"), (False, "MIG 1g.18gb", "free")]


def test_the_dynamic_mig_form_lists_each_gpus_carved_slices_on_page_cli_and_docs(capsys):
    import jsonschema

    from gpulease.core.capacity.cluster_inventory import (
        DRA_NODE,
        ClusterInventory,
        ClusterNode,
        Hold,
    )
    from gpulease.core.capacity.dynamic_mig import partitioned_node
    from gpulease.core.capacity.partitions import free_counts
    from gpulease.hub.cli.commands import cmd_inventory

    carved = partitioned_node("H200", "n1", 2, "580.95.5")
    node = ClusterNode("n1", "H200", DRA_NODE, "580.95.5", free_counts(carved, ()),
                       partitions=carved)
    held = (Hold("ns/jupyter-ada", "n1", {"nvidia.com/mig-3g.71gb": 1}, "ada", "train",
                 devices=("n1/gpu-1-mig-3g71gb-9-4",)),
            Hold("ns/theirs", "n1", {"nvidia.com/mig-1g.18gb": 1},
                 devices=("n1/gpu-1-mig-1g18gb-19-0",)))
    view = cluster_inventory_view(ClusterInventory((node,), held),
                                  datetime(2026, 3, 1, tzinfo=UTC), "ns")
    doc = yaml.safe_load((Path(__file__).resolve().parents[3] / "docs" / "rest-api.yml").read_text())
    jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/Inventory", "components": doc["components"]}
    ).validate(view)
    (table,) = af.cluster_node_tables(view)
    assert table["carved"] == [
        {"gpu": "gpu-0", "slices": []},
        {"gpu": "gpu-1", "slices": [
            {"device": "gpu-1-mig-1g18gb-19-0", "what": "MIG 1g.18gb", "at": 0,
             "holder": "ns/theirs (not gpulease's)"},
            {"device": "gpu-1-mig-3g71gb-9-4", "what": "MIG 3g.71gb", "at": 4,
             "holder": "ada/train"}]}]
    free = {r["resource"]: r["free"] for r in table["rows"]}
    assert free["nvidia.com/mig-3g.71gb"] == 2 and free["nvidia.com/gpu"] == 1

    class Answers:  # stands in for HubClient: the one call cmd_inventory makes
        def call(self, method: str, path: str):
            return view
    assert cmd_inventory(Answers(), SimpleNamespace(json=False)) == 0
    out = capsys.readouterr().out
    assert "    gpu-0: nothing carved\n" in out
    assert ("    gpu-1: 1g.18gb at memory slice 0 (ns/theirs); "
            "3g.71gb at memory slice 4 (ada/train)\n") in out


def test_the_cli_names_a_whole_gpu_carved_without_a_memory_slice(capsys):
    from gpulease.hub.cli.commands import _carved_text

    assert _carved_text({"profile": None, "first_memory_slice": None,
                         "holder": {"user": "ada", "server": "", "tier": "on-demand"}}) == (
        "whole GPU (ada/(default))")
