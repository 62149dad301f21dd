"""The cluster shape's pod needs, from a profile (spawners/kube/pod_spec.py): pure, no cluster."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpulease.core.model.gpu_models import GFD_PRODUCTS, KNOWN_MODELS, model_key_from_gfd_product
from gpulease.core.model.profiles import GpuSpec, Profile
from gpulease.spawners.kube.pod_spec import (
    ClusterGpus,
    gpu_resource,
    kubespawner_traits,
    pod_needs,
    product_values,
)

GiB = 1024**3


def profile(gpu: GpuSpec | None, cpu: str = "4", memory: int = 32 * GiB) -> Profile:
    return Profile(slug="p", display_name="P", description="", gpu=gpu, cpu=Decimal(cpu),
                   memory_bytes=memory, images=("pytorch",), price_per_hour_ucr=1,
                   min_run_s=0, idle_timeout_s=1800, max_runtime_s=0)


def test_every_known_model_has_gfd_products_that_map_back_to_it():
    assert set(GFD_PRODUCTS) == set(KNOWN_MODELS)
    for key, products in GFD_PRODUCTS.items():
        for product in products:
            assert model_key_from_gfd_product(product) == (key, None)
            assert model_key_from_gfd_product(f"{product}-MIG-1g.10gb") == (key, "1g.10gb")


def test_a_mig_slice_is_its_mixed_strategy_resource_on_the_models_products():
    needs = pod_needs(profile(GpuSpec("H200", "1g.18gb")), ClusterGpus())
    assert needs.extended == {"nvidia.com/mig-1g.18gb": 1}
    (term,) = needs.node_affinity
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]}]


def test_under_the_single_strategy_a_slice_is_one_gpu_of_the_mig_product():
    gpu = GpuSpec("A100-80GB", "1g.10gb")
    assert gpu_resource(gpu, "single") == ("nvidia.com/gpu", 1)
    assert product_values(gpu, "single") == ["NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
                                             "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb"]


def test_full_cards_ask_for_that_many_gpus_on_any_board_of_the_model():
    needs = pod_needs(profile(GpuSpec("A100-80GB", None, 2)), ClusterGpus())
    assert needs.extended == {"nvidia.com/gpu": 2}
    assert needs.node_affinity[0]["matchExpressions"][0]["values"] == [
        "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"]
    assert needs.tolerations == ({"key": "nvidia.com/gpu", "operator": "Exists",
                                  "effect": "NoSchedule"},)


def test_a_cpu_only_profile_asks_for_no_gpu_and_no_gpu_node():
    needs = pod_needs(profile(None, cpu="2", memory=4 * GiB), ClusterGpus(scheduler_name="s"))
    assert (needs.extended, needs.node_affinity, needs.tolerations) == ({}, (), ())
    assert needs.scheduler_name == "s" and needs.cpu == Decimal("2")


def test_traits_pin_requests_to_limits_and_lock_the_pod_down():
    traits = kubespawner_traits(pod_needs(profile(GpuSpec("H200", None, 1), "8"), ClusterGpus(
        scheduler_name="gpulease-packing")), "registry.example.org/gpulease/pytorch:2.6")
    assert traits["extra_resource_limits"] == traits["extra_resource_guarantees"] == {
        "nvidia.com/gpu": "1"}
    assert traits["cpu_limit"] == traits["cpu_guarantee"] == 8.0
    assert traits["mem_limit"] == traits["mem_guarantee"] == 32 * GiB
    assert traits["scheduler_name"] == "gpulease-packing"
    assert traits["automount_service_account_token"] is False
    container = traits["container_security_context"]
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert traits["pod_security_context"]["runAsNonRoot"] is True
    assert traits["pod_security_context"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_unknown_models_and_strategies_are_refused_by_name():
    with pytest.raises(ValueError, match="'B200' has no GPU feature discovery product names"):
        product_values(GpuSpec("B200"), "mixed")
    with pytest.raises(ValueError, match="allowed are mixed, single"):
        ClusterGpus(mig_strategy="none")


def test_a_spot_pod_is_lower_priority_and_keeps_running_through_its_grace_period():
    from gpulease.core.tiers import TIER_LABEL
    from gpulease.spawners.kube.pod_spec import SPOT_STOP_S, tier_pod

    on_demand = tier_pod("on-demand", "lab-on-demand", "lab-spot", 120)
    assert on_demand.priority_class == "lab-on-demand" and on_demand.pre_stop_sleep_s == 0
    assert on_demand.labels == {TIER_LABEL: "on-demand"}
    assert on_demand.termination_grace_s is None  # kubespawner's, as ever
    spot = tier_pod("spot", "lab-on-demand", "lab-spot", 119.2)
    assert spot.priority_class == "lab-spot" and spot.labels == {TIER_LABEL: "spot"}
    # the preStop sleep lasts the grace period (rounded up); SIGTERM after it, then time to stop
    assert spot.pre_stop_sleep_s == 120 and spot.termination_grace_s == 120 + SPOT_STOP_S
    # no PriorityClasses configured: none set (the cluster's default priority)
    assert tier_pod("spot", "", "", 120).priority_class == ""
    # a CPU-only server never preempts for CPU or memory, and is not preempted for a GPU
    cpu = tier_pod("on-demand", "lab-on-demand", "lab-spot", 120, gpu=False,
                   cpu_only_class="lab-cpu-only")
    assert cpu.priority_class == "lab-cpu-only" and cpu.pre_stop_sleep_s == 0
