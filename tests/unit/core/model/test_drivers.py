"""Driver compatibility at admission: an image's CUDA needs a new enough NVIDIA driver.

Pure: the version rules, the embedded placement, the cluster's fit and the pod's
node affinity (the real hub and control plane paths: tests/e2e/test_drivers.py and
tests/cluster/test_driver_admission.py)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from gpulease.core.capacity.cluster_fit import fit
from gpulease.core.capacity.cluster_inventory import ClusterInventory, ClusterNode, node_from_object
from gpulease.core.capacity.cluster_offer import nodes_for, too_old_nodes
from gpulease.core.capacity.cluster_queue import Waiting, plan_cluster
from gpulease.core.capacity.placement import NoFit, place
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.drivers import driver_from_labels, driver_version, new_enough, newest
from gpulease.core.model.inventory import parse_declared_inventory
from gpulease.core.model.profiles import GpuSpec
from gpulease.images import shipped_catalog
from gpulease.spawners.kube.pod_spec import avoiding
from tests.cluster.nodes import GpuNode, node_object

PYTORCH = shipped_catalog().get("pytorch")  # CUDA 12.6: driver 560.28 or newer
SLICE = DeviceRequest("H200", "1g.18gb", min_driver="560.28", image="pytorch")
CARDS = DeviceRequest("H200", count=2, min_driver="560.28", image="pytorch")


@pytest.mark.parametrize("text, version", [
    ("570.124.06", (570, 124, 6)), ("560.28", (560, 28)), ("560.28.0", (560, 28)),
    ("550", (550,)), ("", None), (None, None), ("r550", None), ("550.", None),
])
def test_driver_versions_compare_as_numbers(text, version):
    assert driver_version(text) == version


def test_new_enough_and_a_driver_not_declared_is_not_checked(caplog):
    assert new_enough("560.28.03", "560.28") and new_enough("570.86", "560.28")
    assert not new_enough("560.27.99", "560.28") and not new_enough("535.183.01", "560.28")
    assert new_enough("535.1", None)  # an image with no need
    with caplog.at_level(logging.INFO, "gpulease.drivers"):
        assert new_enough(None, "560.28", "GPU 0 of box-x") and new_enough("", "560.28", "GPU 0 of box-x")
    said = [r.getMessage() for r in caplog.records]
    assert said == ["GPU 0 of box-x declares no NVIDIA driver: an image's need for 560.28 or "
                    "newer is not checked there"]  # once per place and need
    assert newest(["550.54.15", "", "560.35.03", "535.1"]) == "560.35.03"


def test_the_images_need_goes_with_the_request():
    request = GpuSpec("H200", "1g.18gb").device_request(PYTORCH)
    assert (request.min_driver, request.image) == ("560.28", "pytorch")
    assert GpuSpec("H200", "1g.18gb").device_request() == DeviceRequest("H200", "1g.18gb")


@pytest.mark.parametrize("labels, driver", [
    ({"nvidia.com/cuda.driver-version.full": "570.124.06"}, "570.124.06"),
    ({"nvidia.com/cuda.driver-version.major": "570", "nvidia.com/cuda.driver-version.minor":
      "124", "nvidia.com/cuda.driver-version.revision": "06"}, "570.124.6"),
    ({"nvidia.com/cuda.driver-version.major": "560", "nvidia.com/cuda.driver-version.minor":
      "28", "nvidia.com/cuda.driver-version.revision": ""}, "560.28"),
    ({"nvidia.com/cuda.driver-version.major": "560"}, ""),
    ({}, ""),
])
def test_a_nodes_driver_from_gpu_feature_discoverys_labels(labels, driver):
    assert driver_from_labels(labels) == driver
    obj = node_object(GpuNode("n1", mig={"1g.18gb": 7}))
    obj["metadata"]["labels"] = {k: v for k, v in obj["metadata"]["labels"].items()
                                 if "driver" not in k} | labels
    assert node_from_object(obj).driver == driver


# --- the embedded box -----------------------------------------------------------------

def _box(*drivers: str | None):
    gpus = [{"model": "H200", "mig": ["1g.18gb"] * 7, **({"driver": d} if d else {})}
            for d in drivers]
    return parse_declared_inventory({"nodes": [{"name": "box", "gpus": gpus}]}, "test")


def test_the_box_refuses_an_image_its_driver_cannot_run_naming_both():
    with pytest.raises(NoFit) as refused:
        place(SLICE, _box("550.54.15", "535.183.01"), held=())
    assert refused.value.status == 422
    assert refused.value.message == (
        "The image pytorch needs NVIDIA driver 560.28 or newer, and no H200 slice 1g.18gb "
        "here has it (the newest driver on one is 550.54.15), so it can never be placed.")
    place(dataclasses.replace(SLICE, min_driver=None), _box("550.54.15"), held=())  # no need


def test_the_box_places_on_the_gpu_whose_driver_runs_the_image_and_on_one_undeclared():
    placed = place(SLICE, _box("550.54.15", "570.86.10"), held=())
    assert placed.devices[0].gpu_index == 1
    assert place(SLICE, _box(None), held=()).devices[0].gpu_index == 0
    new_one = [d.uuid for d in _box("550.54.15", "570.86.10").allocatable() if d.gpu_index == 1]
    with pytest.raises(NoFit) as busy:  # the new GPU's slices all held: wait, not "never"
        place(SLICE, _box("550.54.15", "570.86.10"), held=new_one)
    assert busy.value.status == 503


# --- the cluster ----------------------------------------------------------------------

def _node(name: str, driver: str, **allocatable: int) -> ClusterNode:
    return ClusterNode(name, "H200", "mixed", driver,
                       {f"nvidia.com/{k.replace('mig_', 'mig-').replace('_', '.')}": v
                        for k, v in allocatable.items()})


def test_the_cluster_refuses_when_every_node_of_the_kind_is_too_old():
    inventory = ClusterInventory((_node("old-1", "550.54.15", mig_1g_18gb=7),
                                  _node("old-2", "535.183.01", mig_1g_18gb=7)))
    with pytest.raises(NoFit) as refused:
        fit(SLICE, inventory)
    assert refused.value.status == 422 and "needs NVIDIA driver 560.28" in refused.value.message
    assert "the newest driver on one is 550.54.15" in refused.value.message
    assert fit(dataclasses.replace(SLICE, min_driver=None), inventory) in ("old-1", "old-2")


def test_the_cluster_fits_only_on_new_enough_or_unlabelled_nodes_and_counts_pending_there():
    inventory = ClusterInventory((_node("old", "550.54.15", mig_1g_18gb=7, gpu=8),
                                  _node("new", "570.124.06", mig_1g_18gb=1, gpu=1),
                                  _node("bare", "", gpu=2)))
    assert too_old_nodes(inventory, SLICE) == {"old"}
    assert fit(SLICE, inventory) == "new"  # the fullest-first rule would have chosen old
    with pytest.raises(NoFit) as waits:  # new's one slice goes to the earlier pending start
        fit(SLICE, inventory, pending=(SLICE,))
    assert waits.value.status == 503
    assert fit(CARDS, inventory) == "bare"  # no driver declared: not checked
    assert nodes_for(CARDS, inventory) == {"bare"}
    three = dataclasses.replace(CARDS, count=3)
    with pytest.raises(NoFit, match="largest H200 node with a driver new enough has 2"):
        fit(three, inventory)
    plan = plan_cluster([Waiting("a", SLICE), Waiting("b", SLICE)], inventory)
    assert plan.start == [("a", "new")] and plan.waiting == ["b"]


def test_the_pod_is_kept_off_the_nodes_whose_driver_is_too_old():
    product = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                     "values": ["NVIDIA-H200"]}]}
    terms = avoiding([product], frozenset({"old-2", "old-1"}))
    assert terms == [{**product, "matchFields": [
        {"key": "metadata.name", "operator": "NotIn", "values": ["old-1", "old-2"]}]}]
    assert avoiding([product], frozenset()) == [product]
    assert avoiding([], frozenset({"x"})) == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]}]


def test_the_same_inventory_answers_each_need_and_image_on_its_own():
    """place() indexes an inventory once (gpulease/core/capacity/placement.py): the driver filter is
    kept per need, and a refusal still names the image asked for."""
    box = _box("550.54.15")
    for _ in range(2):
        with pytest.raises(NoFit, match="The image pytorch needs NVIDIA driver 560.28"):
            place(SLICE, box, held=())
        assert place(dataclasses.replace(SLICE, min_driver=None), box, held=()).uuids
        with pytest.raises(NoFit, match="The image tensorrt needs NVIDIA driver 560.28"):
            place(dataclasses.replace(SLICE, image="tensorrt"), box, held=())
        assert place(dataclasses.replace(SLICE, min_driver="550.54"), box, held=()).uuids
