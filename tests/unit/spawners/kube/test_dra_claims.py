"""DRA mode's pod parts (spawners/kube/dra_claims.py, pod_spec.pod_needs): a profile's
ResourceClaimTemplate asks NVIDIA's class for exactly its devices, is named by its
content, and the pod asks nothing of the device plugin. (That the API server takes the
CEL and kube-scheduler allocates by it is tests/cluster/test_dra_cluster.py.)"""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpulease.core.model.profiles import GpuSpec, Profile
from gpulease.spawners.kube.dra_claims import (
    DraClasses,
    claim_spec,
    claim_template,
    device_selectors,
    pod_claims,
    template_name,
    templates_in_use,
)
from gpulease.spawners.kube.pod_spec import ClusterGpus, pod_needs


def profile(gpu: GpuSpec | None) -> Profile:
    return Profile("p", "P", "", gpu, Decimal(4), 8 << 30, (), 1_000_000, 60, 1800, 0)


def test_a_slice_asks_the_mig_class_for_one_device_of_its_profile_and_model():
    spec = claim_spec(GpuSpec("H200", "1g.18gb"))
    (request,) = spec["devices"]["requests"]
    exactly = request["exactly"]
    assert (request["name"], exactly["deviceClassName"], exactly["count"]) == (
        "gpus", "mig.nvidia.com", 1)
    assert [s["cel"]["expression"] for s in exactly["selectors"]] == [
        'device.attributes["gpu.nvidia.com"].productName in ["NVIDIA H200"]',
        'device.attributes["gpu.nvidia.com"].profile == "1g.18gb"']


def test_full_cards_ask_the_gpu_class_for_their_count_of_any_board_of_the_model():
    exactly = claim_spec(GpuSpec("A100-80GB", count=4),
                         DraClasses(gpu="lab-gpus"))["devices"]["requests"][0]["exactly"]
    assert (exactly["deviceClassName"], exactly["count"]) == ("lab-gpus", 4)
    assert [s["cel"]["expression"] for s in exactly["selectors"]] == [
        'device.attributes["gpu.nvidia.com"].productName in '
        '["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"]']


def test_a_model_with_no_product_names_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="'B300' has no NVML product names.*known are A100-40GB"):
        device_selectors(GpuSpec("B300"))


def test_a_template_is_named_by_its_content():
    one, same = claim_spec(GpuSpec("H200", count=2)), claim_spec(GpuSpec("H200", count=2))
    other = claim_spec(GpuSpec("H200", count=4))
    assert template_name(one) == template_name(same) != template_name(other)
    name = template_name(one)
    assert name.startswith("gpulease-gpus-") and len(name) <= 63
    template = claim_template(one, "users", "h200-2")
    assert template["metadata"]["name"] == name
    assert template["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpulease"}
    assert template["spec"] == {"spec": one}


def test_the_pod_names_its_template_and_the_pods_templates_are_in_use():
    entries, uses = pod_claims("gpulease-gpus-abc")
    assert entries == [{"name": "gpus", "resourceClaimTemplateName": "gpulease-gpus-abc"}]
    assert uses == [{"name": "gpus"}]
    pods = [{"spec": {"resourceClaims": entries}}, {"spec": {}},
            {"spec": {"resourceClaims": [{"name": "x", "resourceClaimName": "mine"}]}}]
    assert templates_in_use(pods) == {"gpulease-gpus-abc"}


def test_under_dra_a_gpu_pod_asks_no_extended_resource_and_no_product_affinity():
    gpu = profile(GpuSpec("H200", "1g.18gb"))
    plugin = pod_needs(gpu, ClusterGpus())
    dra = pod_needs(gpu, ClusterGpus(allocation="dra"))
    assert plugin.extended == {"nvidia.com/mig-1g.18gb": 1} and plugin.node_affinity
    assert dra.extended == {} and dra.node_affinity == ()
    assert dra.tolerations == plugin.tolerations and dra.cpu == plugin.cpu
    with pytest.raises(ValueError, match="gpu_allocation 'cdi': allowed are device-plugin, dra"):
        ClusterGpus(allocation="cdi")


def test_a_template_found_under_our_name_is_ours_only_if_it_asks_for_the_same():
    from gpulease.spawners.kube.dra_claims import asks

    ours = claim_spec(GpuSpec("H200", count=2))
    defaulted = {"devices": {"requests": [{**ours["devices"]["requests"][0]}],
                             "constraints": [], "config": []}}
    defaulted["devices"]["requests"][0]["exactly"] = {
        k: v for k, v in ours["devices"]["requests"][0]["exactly"].items()
        if k != "allocationMode"}  # the API server's default
    assert asks(defaulted) == asks(ours)
    broader = claim_spec(GpuSpec("H200", count=8))
    assert asks(broader) != asks(ours)
    anything = {"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": 2}}]}}  # no selector: any GPU
    assert asks(anything) != asks(ours)
    admin = {"devices": {"requests": [{"name": "gpus", "exactly": {
        **ours["devices"]["requests"][0]["exactly"], "adminAccess": True}}]}}
    assert asks(admin) != asks(ours)


def test_a_found_template_with_tolerations_or_a_second_request_is_not_ours():
    from gpulease.spawners.kube.dra_claims import asks

    ours = claim_spec(GpuSpec("H200", "1g.18gb"))
    tolerant = claim_spec(GpuSpec("H200", "1g.18gb"))
    tolerant["devices"]["requests"][0]["exactly"]["tolerations"] = [{"operator": "Exists"}]
    assert asks(tolerant) != asks(ours)
    second = claim_spec(GpuSpec("H200", "1g.18gb"))
    second["devices"]["requests"].append({**second["devices"]["requests"][0], "name": "more"})
    assert asks(second) != asks(ours)
    server_filled = claim_spec(GpuSpec("H200", "1g.18gb"))
    server_filled["devices"]["requests"][0]["exactly"]["tolerations"] = None
    server_filled["devices"]["constraints"] = []
    assert asks(server_filled) == asks(ours)
