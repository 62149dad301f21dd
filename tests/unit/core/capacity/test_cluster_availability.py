"""What users are shown of a profile's GPUs (gpulease/core/capacity/cluster_availability.py): pure, and the
start form built from it whatever the shape (spawners/start/spawn_page.py, options_form)."""

from __future__ import annotations

import json

from gpulease.core.capacity.cluster_availability import (
    FREE,
    NEVER,
    QUEUE,
    Availability,
    cluster_availability,
    host_availability,
    unknown,
)
from gpulease.core.capacity.cluster_inventory import ClusterInventory, ClusterNode, Hold
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import DEMO_INVENTORY, load_declared_inventory
from gpulease.core.model.profiles import SAMPLE_PROFILES, load_profiles_file
from gpulease.images import shipped_catalog
from gpulease.spawners.start.options_form import FormData, render_options_form

SLICE = DeviceRequest("H200", "1g.18gb")
TWO = DeviceRequest("H200", None, 2)
MIG = "nvidia.com/mig-1g.18gb"
GPU = "nvidia.com/gpu"


def _node(name: str, schedulable: bool = True, **resources: int) -> ClusterNode:
    return ClusterNode(name, "H200", "mixed", "570", resources, schedulable)


def _cluster(*holds: Hold) -> ClusterInventory:
    return ClusterInventory((_node("a", **{MIG: 4}), _node("b", **{MIG: 3}),
                             ClusterNode("c", "H200", "mixed", "570", {GPU: 2}),
                             ClusterNode("d", "H200", "mixed", "570", {GPU: 2})), holds)


def test_free_counts_come_from_the_nodes_minus_every_pods_holds():
    inventory = _cluster(Hold("x/batch", "a", {MIG: 3}), Hold("ns/jupyter-bob", "b", {MIG: 1},
                                                               "bob"))
    assert cluster_availability(SLICE, inventory) == Availability(3, 7, FREE)
    assert cluster_availability(TWO, inventory) == Availability(4, 4, FREE)


def test_cards_free_on_two_nodes_are_not_two_on_one_node_the_start_would_queue():
    inventory = _cluster(Hold("x/one", "c", {GPU: 1}), Hold("x/two", "d", {GPU: 1}))
    assert cluster_availability(TWO, inventory) == Availability(2, 4, QUEUE)
    full = _cluster(Hold("x/a", "c", {GPU: 2}), Hold("x/b", "d", {GPU: 2}))
    assert cluster_availability(TWO, full) == Availability(0, 4, QUEUE)


def test_admitted_unbound_starts_count_and_waiting_ones_go_first():
    inventory = _cluster(Hold("x/c", "c", {GPU: 2}))
    assert cluster_availability(TWO, inventory).state == FREE
    # an admitted start whose pod is not bound yet takes node d's two
    assert cluster_availability(TWO, inventory, admitted=(TWO,)) == Availability(0, 4, QUEUE)
    # a start waiting for two cards goes first: it keeps node d, this one would queue
    assert cluster_availability(TWO, inventory, waiting=(TWO,)).state == QUEUE
    assert cluster_availability(SLICE, inventory, waiting=(TWO,)).state == FREE  # other kind


def test_a_cordoned_node_counts_in_the_total_not_as_free():
    inventory = ClusterInventory((_node("a", schedulable=False, **{MIG: 7}),))
    assert cluster_availability(SLICE, inventory) == Availability(0, 7, QUEUE)


def test_what_no_node_offers_never_fits_and_says_what_exists():
    shown = cluster_availability(DeviceRequest("A100-80GB", None), _cluster())
    assert shown.state == NEVER and shown.total == 0
    assert "No node offers" in shown.why and "H200 slice 1g.18gb" in shown.why
    eight = cluster_availability(DeviceRequest("H200", None, 8), _cluster())
    assert eight.state == NEVER and "the largest H200 node has 2" in eight.why


def test_the_host_inventory_the_embedded_shape_shows():
    inventory = load_declared_inventory(DEMO_INVENTORY)  # one full card, one H200 in 7 slices
    card = DeviceRequest("H200")
    assert host_availability(inventory, set(), SLICE) == Availability(7, 7, FREE)
    assert host_availability(inventory, {"GPU-declared-local-1"}, card) == Availability(
        0, 1, QUEUE)
    two = host_availability(inventory, set(), TWO)
    assert (two.free, two.total, two.state) == (1, 1, NEVER) and two.why


def test_the_form_shows_each_state():
    catalog = shipped_catalog()
    cpu, slice_, full = load_profiles_file(SAMPLE_PROFILES, catalog)
    html = render_options_form(FormData(profiles=[cpu, slice_, full], availability={
        slice_.slug: Availability(3, 7, FREE), full.slug: Availability(2, 4, QUEUE)}))
    assert "3 of 7 free</span>" in html and 'data-state="free"' in html
    assert "2 of 4 free now: you will wait in the queue" in html
    html = render_options_form(FormData(profiles=[slice_, full], availability={
        slice_.slug: Availability(0, 0, NEVER, "No node offers H200 slice 1g.18gb <x>, so"),
        full.slug: unknown("Cannot read the cluster's nodes")}))
    assert 'data-state="never">No node offers H200 slice 1g.18gb &lt;x&gt;, so' in html
    assert "Availability unknown: Cannot read the cluster&#x27;s nodes" in html


def test_the_service_counts_the_nodes_the_spawner_admits_to():
    """gpulease up hands the service the admin's node selector and GPU tolerations."""
    from traitlets.config import Config

    from gpulease.hub.config.cluster_shape import spawner_nodes
    from gpulease.hub.service.cluster_source import source_from_env
    from gpulease.spawners.kube.pod_spec import DEFAULT_GPU_TOLERATIONS

    config = Config()
    config.GPUKubeSpawner.node_selector = {"pool": "gpu"}
    nodes = spawner_nodes(config)
    assert nodes == {"node_selector": {"pool": "gpu"},
                     "tolerations": [dict(t) for t in DEFAULT_GPU_TOLERATIONS],
                     "allocation": "device-plugin"}
    config.GPUKubeSpawner.gpu_tolerations = []
    assert spawner_nodes(config)["tolerations"] == []
    source = source_from_env({"GPULEASE_CLUSTER_NAMESPACE": "lab",
                              "GPULEASE_CLUSTER_NODES": json.dumps(nodes)})
    assert not source.dra
    config.GPUKubeSpawner.gpu_allocation = "dra"  # the service lists slices and claims too
    assert source_from_env({"GPULEASE_CLUSTER_NAMESPACE": "lab", "GPULEASE_CLUSTER_NODES":
                            json.dumps(spawner_nodes(config))}).dra
    inventory = ClusterInventory((
        ClusterNode("in", "H200", "mixed", "570", {MIG: 7}, labels={"pool": "gpu"}),
        ClusterNode("out", "H200", "mixed", "570", {MIG: 7}, labels={"pool": "cpu"})))
    assert cluster_availability(SLICE, source.spawner_nodes(inventory)) == Availability(
        7, 7, FREE)
