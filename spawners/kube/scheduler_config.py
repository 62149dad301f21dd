"""gpulease's GPU-packing kube-scheduler: the KubeSchedulerConfiguration it runs with. Pure.

Kubernetes decides where a pod runs; gpulease only configures how. The
default scheduler scores nodes `LeastAllocated` over cpu and memory (plus
NodeResourcesBalancedAllocation) and does not look at GPUs at all: one-GPU
pods spread over every node, and an 8-GPU request then finds no whole node
free while GPUs sit idle. This second scheduler, a profile of the stock
kube-scheduler binary, scores `MostAllocated` instead (as Zero to
JupyterHub's user-scheduler does for cpu and memory), weighted on
`nvidia.com/gpu` and on each `nvidia.com/mig-<profile>` the profiles use:

- Resource names are matched exactly: kube-scheduler validates only the
  weights, so a wildcard such as `nvidia.com/mig-*` would be accepted and do
  nothing. Every MIG profile of the hub's profiles is listed by its name
  (`gpu_resources`), so the configuration is generated again when profiles
  change (`gpulease cluster scheduler-config`).
- A resource a pod does not request is left out of its score, so a one-GPU
  pod is scored on GPUs, cpu and memory, a 1g.18gb pod on that slice, cpu
  and memory. GPUs weigh more than cpu and memory: a node is full when its
  GPUs are.
- NodeResourcesBalancedAllocation is disabled (it pulls towards nodes whose
  cpu and memory are equally used, against packing), and so is
  ImageLocality (an image already on a node would outweigh packing).
- `percentageOfNodesToScore: 100`: by default a scheduler of a large
  cluster stops after finding a share of the feasible nodes (42% of 1,000)
  and may never see the fullest one.
- Leader election by a Lease of the scheduler's own name, so two replicas
  (the Helm chart's) never both bind.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpulease.spawners.kube.pod_spec import MIG_STRATEGIES

CONFIG_API = "kubescheduler.config.k8s.io/v1"
DEFAULT_SCHEDULER_NAME = "gpulease-scheduler"
WHOLE_GPU = "nvidia.com/gpu"
GPU_WEIGHT = 10  # against cpu and memory at 1 each: GPUs decide which node is fullest
CPU_MEMORY_WEIGHT = 1
# The API server's rules: a pod's spec.schedulerName and a Lease's name are DNS-1123
# subdomains, a namespace a DNS-1123 label. A name breaking them is refused only later,
# on every GPU pod's create or the Lease's, so the configuration refuses it first.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
DNS_LABEL = re.compile(_LABEL)


def name_problem(name: str, what: str, label: bool = False) -> str | None:
    """Why `name` is no valid Kubernetes name for `what`, or None."""
    longest, pattern = (63, DNS_LABEL) if label else (253, DNS_SUBDOMAIN)
    if len(name) <= longest and pattern.fullmatch(name):
        return None
    allowed = "lower-case letters, digits and '-'" + ("" if label else " and '.'")
    return (f"{what} {name!r} is not a valid Kubernetes name: {allowed}, starting and ending "
            f"with a letter or digit, at most {longest} characters")


@dataclass(frozen=True)
class SchedulerSettings:
    """What differs between clusters; the defaults are the Helm chart's."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    mig_strategy: str = "mixed"  # the device plugin's: MIG slices named per profile, or not
    leader_elect: bool = True
    lease_namespace: str = "kube-system"
    kubeconfig: str = ""  # empty: in-cluster (the chart); a file for a scheduler run by hand

    def __post_init__(self) -> None:
        if self.mig_strategy not in MIG_STRATEGIES:
            raise ValueError(f"mig_strategy {self.mig_strategy!r}: allowed are "
                             f"{', '.join(MIG_STRATEGIES)}")
        if not self.scheduler_name:
            raise ValueError("scheduler_name is empty: the pods name their scheduler by it")
        problem = (name_problem(self.scheduler_name, "scheduler_name")
                   or name_problem(self.lease_namespace, "lease_namespace", label=True))
        if problem:
            raise ValueError(problem)


def gpu_resources(mig_profiles: Iterable[str | None], mig_strategy: str = "mixed") -> list[str]:
    """The extended resources GPU pods of these profiles request, by their exact names.

    `nvidia.com/gpu` always (whole cards; every slice under the `single`
    strategy); under `mixed` also `nvidia.com/mig-<profile>` for each MIG
    profile, sorted."""
    names = {f"nvidia.com/mig-{p}" for p in mig_profiles if p} if mig_strategy == "mixed" else ()
    return [WHOLE_GPU, *sorted(names)]


def scheduler_configuration(mig_profiles: Iterable[str | None],
                            settings: SchedulerSettings = SchedulerSettings()) -> dict:
    """The KubeSchedulerConfiguration of gpulease's packing scheduler for these MIG profiles."""
    resources = [{"name": name, "weight": GPU_WEIGHT}
                 for name in gpu_resources(mig_profiles, settings.mig_strategy)]
    resources += [{"name": "cpu", "weight": CPU_MEMORY_WEIGHT},
                  {"name": "memory", "weight": CPU_MEMORY_WEIGHT}]
    leader_election: dict = {"leaderElect": settings.leader_elect}
    if settings.leader_elect:
        leader_election.update(resourceLock="leases", resourceName=settings.scheduler_name,
                               resourceNamespace=settings.lease_namespace)
    config: dict = {
        "apiVersion": CONFIG_API,
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": leader_election,
        "percentageOfNodesToScore": 100,
        "profiles": [{
            "schedulerName": settings.scheduler_name,
            "plugins": {"score": {"disabled": [{"name": "NodeResourcesBalancedAllocation"},
                                               {"name": "ImageLocality"}]}},
            "pluginConfig": [{
                "name": "NodeResourcesFit",
                "args": {"scoringStrategy": {"type": "MostAllocated", "resources": resources}},
            }],
        }],
    }
    if settings.kubeconfig:
        config["clientConnection"] = {"kubeconfig": settings.kubeconfig}
    return config


def profiles_mig(profiles: Iterable[dict]) -> list[str | None]:
    """The MIG profile of each profile spec (the profiles file's or api/profiles' form)."""
    return [(p.get("gpu") or {}).get("mig") for p in profiles]
