"""Admission's readings of a DRA inventory (gpulease/core/capacity/dra_inventory.py): the
limits' holdings (spawners/kube/cluster_runner.py cluster_holdings), the spawn page's
availability and the reserved pool take it as they take a device plugin's."""

from __future__ import annotations

from gpulease.core.capacity.cluster_availability import FREE, QUEUE, cluster_availability
from gpulease.core.capacity.dra_inventory import dra_inventory
from gpulease.core.model.device_request import DeviceRequest
from gpulease.spawners.kube.cluster_runner import cluster_holdings
from tests.cluster.dra_driver import node_slice
from tests.unit.core.capacity.test_dra_inventory import (
    CARDS,
    MIG,
    NS,
    claim,
    names,
    node_object,
    pod,
)


def test_limits_availability_and_reservations_read_a_dra_inventory_as_a_device_plugins():
    """The spawn page's availability, the limits' holdings and the reserved pool take the
    DRA inventory unchanged: slices count as slices, cards as cards, by their holders."""
    mig, cards = names(MIG, "mig"), names(CARDS, "gpu")
    pods = [pod("jupyter-ada", "u1", "ada", "dra-mig"),
            pod("jupyter-bo", "u2", "bo", "dra-cards", tier="reserved")]
    pods[1]["metadata"]["labels"]["gpulease.io/reservation"] = "7"
    claims = [claim("c1", [("dra-mig", mig[0])], "u1"),
              claim("c2", [("dra-cards", c) for c in cards], "u2")]
    inventory = dra_inventory([node_object(MIG), node_object(CARDS)],
                              [node_slice(MIG), node_slice(CARDS)], claims, pods, NS)
    assert sorted((h.user, h.gpus, h.slices) for h in cluster_holdings(inventory, {})) == [
        ("ada", 0, 1), ("bo", 4, 0)]
    slice_ = cluster_availability(DeviceRequest("H200", "1g.18gb"), inventory)
    assert (slice_.free, slice_.total, slice_.state) == (6, 7, FREE)
    full = cluster_availability(DeviceRequest("H200", count=2), inventory)
    assert (full.free, full.total, full.state) == (0, 4, QUEUE)
    (reserved,) = [h for h in inventory.holds if h.user == "bo"]
    assert (reserved.tier, reserved.reservation) == ("reserved", 7)
