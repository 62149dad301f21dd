"""The packing scheduler's configuration (spawners/kube/scheduler_config.py) and its CLI, without a hub.

The real kube-scheduler loading it, and placing pods with it, is in
tests/cluster/test_packing_scheduler.py; the configuration following the
hub's profiles as they change, in tests/e2e/test_embedded.py.
"""

from __future__ import annotations

import pytest
import yaml

from gpulease.core.model.profiles import SAMPLE_PROFILES, load_profiles_file
from gpulease.hub import cli
from gpulease.hub.cli import commands
from gpulease.images import shipped_catalog
from gpulease.spawners.kube.scheduler_config import (
    SchedulerSettings,
    gpu_resources,
    profiles_mig,
    scheduler_configuration,
)


def _fit_args(config: dict) -> dict:
    (profile,) = config["profiles"]
    (fit,) = [c for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    return fit["args"]["scoringStrategy"]


def test_most_allocated_weighted_on_each_mig_resource_by_its_exact_name():
    config = scheduler_configuration(["1g.18gb", None, "3g.71gb", "1g.18gb"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    strategy = _fit_args(config)
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert weights == {"nvidia.com/gpu": 10, "nvidia.com/mig-1g.18gb": 10,
                       "nvidia.com/mig-3g.71gb": 10, "cpu": 1, "memory": 1}
    assert not any("*" in name for name in weights)  # kube-scheduler would ignore a wildcard


def test_balanced_allocation_is_off_every_node_is_scored_and_leader_election_is_on():
    config = scheduler_configuration([])
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "gpulease-scheduler"
    disabled = {p["name"] for p in profile["plugins"]["score"]["disabled"]}
    assert "NodeResourcesBalancedAllocation" in disabled
    assert config["percentageOfNodesToScore"] == 100
    assert config["leaderElection"] == {
        "leaderElect": True, "resourceLock": "leases", "resourceName": "gpulease-scheduler",
        "resourceNamespace": "kube-system"}
    assert "clientConnection" not in config  # in-cluster credentials


def test_settings_name_lease_and_kubeconfig():
    settings = SchedulerSettings(scheduler_name="gpu-packer", lease_namespace="gpulease",
                                 kubeconfig="/etc/k/s.conf")
    config = scheduler_configuration(["2g.35gb"], settings)
    assert config["profiles"][0]["schedulerName"] == "gpu-packer"
    assert config["leaderElection"]["resourceName"] == "gpu-packer"
    assert config["leaderElection"]["resourceNamespace"] == "gpulease"
    assert config["clientConnection"] == {"kubeconfig": "/etc/k/s.conf"}
    single = scheduler_configuration([], SchedulerSettings(leader_elect=False))
    assert single["leaderElection"] == {"leaderElect": False}


def test_single_strategy_slices_are_whole_gpu_resources():
    assert gpu_resources(["1g.18gb", "3g.71gb"], "single") == ["nvidia.com/gpu"]
    assert gpu_resources(["1g.18gb"], "mixed") == ["nvidia.com/gpu", "nvidia.com/mig-1g.18gb"]


@pytest.mark.parametrize("bad, says", [
    (dict(mig_strategy="none"), "mixed, single"),
    (dict(scheduler_name=""), "scheduler_name is empty"),
    # refused by the API server only later, on every GPU pod (spec.schedulerName) or the Lease
    (dict(scheduler_name="GPU Packer"), "scheduler_name 'GPU Packer' is not a valid Kubernetes"),
    (dict(scheduler_name="packer-"), "starting and ending with a letter or digit"),
    (dict(scheduler_name="p" * 254), "at most 253"),
    (dict(lease_namespace="kube_system"), "lease_namespace 'kube_system'"),
    (dict(lease_namespace="a.b"), "digits and '-', starting"),  # a label: no dots
])
def test_bad_settings_are_named(bad, says):
    with pytest.raises(ValueError, match=says):
        SchedulerSettings(**bad)


def test_cli_from_a_profiles_file_needs_no_hub(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("GPULEASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # no embedded hub's state folder here
    assert cli.main(["cluster", "scheduler-config", "--profiles", str(SAMPLE_PROFILES),
                     "--scheduler-name", "packer"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    migs = profiles_mig(p.to_spec() for p in load_profiles_file(SAMPLE_PROFILES, shipped_catalog()))
    names = {r["name"] for r in _fit_args(config)["resources"]}
    assert {f"nvidia.com/mig-{m}" for m in migs if m} <= names
    assert any(m for m in migs)  # the sample has MIG profiles: the check above means something
    assert config["profiles"][0]["schedulerName"] == "packer"


def test_cli_names_what_is_wrong_in_a_profiles_file(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles:\n  - slug: x\n    display_name: X\n    gpu: {model: H200, mig: 1g.10gb}\n"
                   "    cpu: 1\n    memory: 1Gi\n    images: [pytorch]\n    price_per_hour: '1'\n")
    assert cli.main(["cluster", "scheduler-config", "--profiles", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not a valid profiles file" in err and "gpu.mig" in err and "1g.18gb" in err
    assert cli.main(["cluster", "scheduler-config", "--profiles", str(tmp_path / "no.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert cli.main(["cluster", "scheduler-config", "--profiles", str(SAMPLE_PROFILES),
                     "--scheduler-name", "GPU_packer"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "'GPU_packer' is not a valid Kubernetes name" in captured.err


def test_valid_names_pass():
    settings = SchedulerSettings(scheduler_name="gpulease.packer-2", lease_namespace="gpu-1")
    assert scheduler_configuration([], settings)["profiles"][0]["schedulerName"] == \
        "gpulease.packer-2"


def _node(name: str, free: int, allocatable: int = 8, schedulable: bool = True,
          resource: str = "nvidia.com/gpu") -> dict:
    return {"name": name, "model": "H200", "schedulable": schedulable,
            "resources": [{"resource": resource, "allocatable": allocatable, "free": free,
                           "holders": []}]}


def test_inventory_summary_shows_fragmentation():
    """`gpulease inventory` on a cluster: 8 GPUs free in ones start no 8-GPU request."""
    spread = [_node(f"n{i}", 1) for i in range(8)]
    packed = [_node("n0", 8), *(_node(f"n{i}", 0) for i in range(1, 8))]
    assert commands.cluster_summary(spread) == [
        "H200 nvidia.com/gpu: 8/64 free on 8 nodes; 0 wholly free; the most one start can get "
        "now: 1"]
    assert commands.cluster_summary(packed) == [
        "H200 nvidia.com/gpu: 8/64 free on 8 nodes; 1 wholly free; the most one start can get "
        "now: 8"]
    # a cordoned node's free GPUs start nothing
    cordoned = [_node("n0", 8, schedulable=False), _node("n1", 2)]
    assert commands.cluster_summary(cordoned)[0].endswith("on 1 node; 0 wholly free; the most one "
                                                     "start can get now: 2")


class _StandInHub:
    """A stand-in for HubClient (no hub here): api/profiles answers `profiles`."""

    def __init__(self, profiles: list[dict]):
        self.profiles = profiles

    def call(self, method: str, path: str, body=None, params=None):
        assert (method, path) == ("GET", "api/profiles")
        return {"profiles": self.profiles}


def _args():
    return commands.build_parser().parse_args(["cluster", "scheduler-config"])


@pytest.mark.parametrize("profiles, says", [
    ([], "showed no profiles"),  # a researcher whose groups have none looks like this
    ([{"slug": "a", "gpu": {"model": "H200", "mig": "1g.18gb"}}], "only the profiles"),
])
def test_a_token_that_cannot_see_every_profile_is_refused(capsys, profiles, says):
    from gpulease.hub.cli.cluster import cmd_cluster

    assert cmd_cluster(_StandInHub(profiles), _args()) == 2
    captured = capsys.readouterr()
    assert says in captured.err and "admin's token" in captured.err and captured.out == ""


def test_an_admins_view_prints_the_configuration(capsys):
    from gpulease.hub.cli.cluster import cmd_cluster

    admin_view = [{"slug": "a", "enabled": False, "gpu": {"model": "H200", "mig": "2g.35gb"}}]
    assert cmd_cluster(_StandInHub(admin_view), _args()) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert "nvidia.com/mig-2g.35gb" in {r["name"] for r in _fit_args(config)["resources"]}
