"""Partitionable devices read from ResourceSlices (gpulease/core/capacity/dra_partitions.py):
the DynamicMIG slices of the driver's test double (tests/cluster/dra_driver.py
pool_slices, no API server) read as the same PartitionedNode that
gpulease/core/capacity/dynamic_mig.py builds from the MIG geometry; a device the
scheduler would not give is left out, and so is a pool not all of whose slices are there."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from gpulease.core.capacity import partitions
from gpulease.core.capacity.dra_inventory import current_slices
from gpulease.core.capacity.dra_partitions import partition_key, partitioned_nodes
from gpulease.core.capacity.dynamic_mig import mig_resource, partitioned_node
from gpulease.core.capacity.partitions import PartitionedNode
from gpulease.core.model import nvidia_dra as nv
from gpulease.core.model.gpu_models import MIG_PROFILES
from tests.cluster.dra_driver import device_uuid, dynamic_mig_uuid, gpu_uuid, pool_slices
from tests.cluster.nodes import GpuNode

NODE = "dyn"


def spec(model: str = "H200", gpus: int = 2) -> GpuNode:
    return GpuNode(NODE, model=model, gpus=gpus, dra=True, dynamic_mig=True)


def read(slices: list[dict]) -> dict[str, PartitionedNode]:
    return partitioned_nodes(current_slices(slices))


def canonical(node: PartitionedNode) -> PartitionedNode:
    """The node with each device's consumption in one order: the API (Go's JSON) writes a
    counter map in key order, the geometry in capacity order; the rule reads it as a set."""
    return PartitionedNode(dict(node.counter_sets), tuple(
        replace(d, consumes=tuple(sorted(d.consumes))) for d in node.devices))


@pytest.mark.parametrize("model", sorted(MIG_PROFILES))
@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_the_published_slices_read_as_the_geometry_builds_the_node(model: str, gpus: int):
    (name, node), = read(pool_slices(spec(model, gpus))).items()
    built = partitioned_node(model, NODE, gpus)
    assert name == NODE
    assert [d.key for d in node.devices] == [d.key for d in built.devices]  # allocator order
    assert list(node.counter_sets) == list(built.counter_sets)
    assert canonical(node) == canonical(built)


def test_the_slices_are_split_as_the_driver_writes_them_within_the_api_limits():
    slices = pool_slices(spec(gpus=8), generation=3, owner="uid-1")
    names = [s["metadata"]["name"] for s in slices]
    assert names == sorted(names) == [f"{NODE}-{nv.DRIVER}-3-{i:02d}" for i in range(9)]
    counters, *per_gpu = [s["spec"] for s in slices]
    assert {(s["nodeName"], s["pool"]["name"], s["pool"]["generation"],
             s["pool"]["resourceSliceCount"], s["driver"]) for s in [counters, *per_gpu]} == {
        (NODE, NODE, 3, 9, nv.DRIVER)}
    assert "devices" not in counters and all("sharedCounters" not in s for s in per_gpu)
    assert [c["name"] for c in counters["sharedCounters"]] == [
        f"gpu-{m}-counter-set" for m in range(8)]
    assert len(counters["sharedCounters"]) <= 8
    assert all(len(c["counters"]) <= 32 for c in counters["sharedCounters"])
    assert {o["uid"] for s in slices for o in s["metadata"]["ownerReferences"]} == {"uid-1"}
    for minor, gpu in enumerate(per_gpu):
        devices = gpu["devices"]
        assert 0 < len(devices) <= nv.MAX_DEVICES_PER_SLICE_WITH_COUNTERS
        assert [d["name"] for d in devices] == sorted(d["name"] for d in devices)
        assert all(len(d["consumesCounters"]) <= 2 for d in devices)
        assert {u["counterSet"] for d in devices for u in d["consumesCounters"]} == {
            f"gpu-{minor}-counter-set"}
        full, *migs = [d for d in devices if d["name"] == f"gpu-{minor}"] + [
            d for d in devices if d["name"] != f"gpu-{minor}"]
        assert full["attributes"][nv.UUID]["string"] == gpu_uuid(NODE, minor)
        assert full["consumesCounters"][0]["counters"] == counters["sharedCounters"][minor][
            "counters"]  # the full GPU consumes everything
        for mig in migs:  # no uuid until prepared; its parent's productName and driver
            attributes = mig["attributes"]
            assert nv.UUID not in attributes
            assert attributes[nv.PARENT_UUID]["string"] == gpu_uuid(NODE, minor)
            assert attributes[nv.PRODUCT_NAME] == full["attributes"][nv.PRODUCT_NAME]
            assert set(mig["capacity"]) == {"multiprocessors", "copyEngines", "decoders",
                                            "encoders", "jpegEngines", "ofaEngines", "memory"}
    # the driver's quantities are BinarySI: counts plain, bytes in the largest unit
    shared = counters["sharedCounters"][0]["counters"]
    assert shared["memory"] == {"value": "141Gi"} and shared["memory-slice-7"] == {"value": "1"}
    assert shared["multiprocessors"] == {"value": "132"}
    one = next(d for d in per_gpu[0]["devices"] if d["name"] == "gpu-0-mig-1g18gb-19-3")
    assert one["capacity"]["memory"] == {"value": "18048Mi"}
    assert set(one["consumesCounters"][0]["counters"]) >= {"memory-slice-3", "copy-engines"}
    assert "memory-slice-4" not in one["consumesCounters"][0]["counters"]


def test_a_placement_prepared_is_a_stable_mig_device_and_the_full_gpu_its_own_uuid():
    (_, gpu) = pool_slices(spec(gpus=1))
    by_name = {d["name"]: d for d in gpu["spec"]["devices"]}
    mig = by_name["gpu-0-mig-3g71gb-9-4"]
    assert device_uuid(NODE, mig) == dynamic_mig_uuid(NODE, mig["name"])
    assert device_uuid(NODE, mig).startswith("MIG-")
    assert device_uuid(NODE, mig) != device_uuid(NODE, by_name["gpu-0-mig-3g71gb-9-0"])
    assert device_uuid(NODE, by_name["gpu-0"]) == gpu_uuid(NODE, 0)


def _device(slices: list[dict], name: str) -> dict:
    return next(d for s in slices for d in s["spec"].get("devices") or [] if d["name"] == name)


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_a_tainted_device_is_never_handed_out_but_counts_while_allocated(effect: str):
    slices = copy.deepcopy(pool_slices(spec()))
    _device(slices, "gpu-1-mig-2g35gb-14-2")["taints"] = [
        {"key": "gpu.nvidia.com/unhealthy", "value": "xid", "effect": effect}]
    node = read(slices)[NODE]
    tainted = node.device(partition_key(NODE, "gpu-1-mig-2g35gb-14-2"))
    assert tainted is not None and not tainted.allocatable
    # the placements beside it are still there: the next 2g after GPU 1's first skips it
    taken = {partition_key(NODE, "gpu-0"), partition_key(NODE, "gpu-1-mig-2g35gb-14-0")}
    assert partitions.first_fit(node, mig_resource("2g.35gb"), taken).key == partition_key(
        NODE, "gpu-1-mig-2g35gb-14-4")
    # the driver's health check taints a device its pod still holds: the scheduler still
    # counts its memory slices, and so does gpulease (no 1g at 2 or 3 of GPU 1)
    held = taken | {tainted.key}
    one = partitions.carve(node, [mig_resource("1g.18gb")] * 3, held)
    assert [d.key for d in one] == [partition_key(NODE, f"gpu-1-mig-1g18gb-19-{i}")
                                    for i in (4, 5, 6)]


def test_a_mig_device_of_no_profile_and_a_device_of_another_type_are_never_handed_out():
    slices = copy.deepcopy(pool_slices(spec(gpus=1)))
    del _device(slices, "gpu-0-mig-1g18gb-19-0")["attributes"][nv.MIG_PROFILE]
    _device(slices, "gpu-0-mig-1g35gb-15-0")["attributes"][nv.TYPE] = {"string": "vfio"}
    node = read(slices)[NODE]
    for name in ("gpu-0-mig-1g18gb-19-0", "gpu-0-mig-1g35gb-15-0"):
        odd = node.device(partition_key(NODE, name))
        assert odd is not None and not odd.allocatable and odd.resource == ""
    assert partitions.first_fit(node, mig_resource("1g.18gb"), ()).key == partition_key(
        NODE, "gpu-0-mig-1g18gb-19-1")
    # allocated all the same (someone's claim), it takes its slices: 0 and 1 are gone
    left = partitions.free_counts(node, {partition_key(NODE, "gpu-0-mig-1g35gb-15-0")})
    assert left[mig_resource("1g.18gb")] == 5


@pytest.mark.parametrize("missing", [0, 1, 2])  # the counter sets' slice, or a GPU's
def test_a_pool_with_a_slice_missing_yields_nothing(missing: int):
    slices = pool_slices(spec())
    assert read(slices)
    assert read(slices[:missing] + slices[missing + 1:]) == {}


def test_a_new_generation_half_written_yields_nothing_and_whole_replaces_the_old():
    old, new = pool_slices(spec(), generation=1), pool_slices(spec(), generation=2)
    assert read(old + new[:2]) == {}  # the newest generation counts, and it is incomplete
    assert canonical(read(old + new)[NODE]) == canonical(read(old)[NODE])


def test_static_slices_have_no_partitions():
    static = pool_slices(GpuNode("cards", gpus=2, mig={"1g.18gb": 7}, dra=True))
    assert len(static) == 1 and read(static) == {}
