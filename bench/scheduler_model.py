"""kube-scheduler's node choice for one pod, as its source computes it. Pure.

A model of what kube-scheduler v1.36.3 (the version tests/cluster/tools
builds; read in k8s.io/kubernetes@v1.36.3) does with a pod whose requests are
plain numbers (cpu in millicores, memory in bytes, extended resources in
units), for bench/placement.py. Checked in that source:

- Filter, NodeResourcesFit (plugins/noderesources/fit.go `fitsRequest`): the
  pod count fits the node's `pods`, and every resource the pod requests fits
  in allocatable minus what the bound pods request.
- Score: each score plugin's score (0..100, `fwk.MaxNodeScore`) times its
  weight, summed (framework/runtime). Default profile
  (apis/config/v1/default_plugins.go): NodeResourcesFit weight 1,
  NodeResourcesBalancedAllocation weight 1 (and TaintToleration, NodeAffinity,
  PodTopologySpread, InterPodAffinity, ImageLocality, which give every node the
  same score, or skip, for a bare pod with no affinities, no Service, tolerations
  of no PreferNoSchedule taint and one image everywhere: left out).
- NodeResourcesFit's scoring strategy (defaults.go: LeastAllocated over cpu
  and memory at weight 1 unless configured). resource_allocation.go
  `calculateNodeAllocatableRequest`: a *scalar* resource (an extended one such
  as nvidia.com/gpu, hugepages-*, *kubernetes.io/*; utils.go
  IsScalarResourceName) the pod does not request is skipped, and so is one the
  node has none of; cpu and memory always count. least_allocated.go:
  (allocatable - requested) * 100 / allocatable per resource (0 past full),
  most_allocated.go: requested * 100 / allocatable (capped at full); both the
  weighted average, integer division, over the resources not skipped
  (0 when all are). `requested` is what the node's pods request plus this pod
  (NonZeroRequested for cpu and memory, which is the same for pods that
  request both, as every pod here does).
- balanced_allocation.go: PreScore skips best-effort pods (no request of its
  resources); otherwise the standard deviation of the requested fractions
  (each capped at 1; |f1 - f2| / 2 for two resources) gives
  int((1 - std) * 100), computed with the pod and without it, and the score
  is 50 + (50 + with - without) / 2 (Go's integer division).
- schedule_one.go: `numFeasibleNodesToFind`: every node under 100 nodes;
  else percentageOfNodesToScore, or when 0 the adaptive 50 - nodes/125
  (at least 5), of all nodes, at least 100 (42% of 1,000: 420). The filter
  scans nodes from `nextStartNodeIndex`, stops when one more feasible node
  than that is found, and the index moves on by the nodes it processed
  (modelled sequentially; the real scan runs 16 goroutines, so a few more
  nodes are processed). One feasible node is taken without scoring; else the
  highest total score wins, ties broken uniformly at random (a heap on
  (score, rand.Int())).
- Not modelled: OpportunisticBatching (beta, on since 1.35) hands the next
  pod of the same signature, within 500 ms and only once the previous pod's
  node is full for it, the next node of the previous ranking: the node a
  fresh ranking would pick too, bar ties and the search window.

First-fit (not a kube-scheduler policy; the baseline) takes the first
feasible node in the nodes' fixed order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from random import Random

MAX_NODE_SCORE = 100
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5
LEAST_ALLOCATED = "LeastAllocated"
MOST_ALLOCATED = "MostAllocated"
FIRST_FIT = "FirstFit"
FIT = "NodeResourcesFit"
BALANCED = "NodeResourcesBalancedAllocation"


@dataclass(frozen=True)
class ResourceSpec:
    name: str
    weight: int = 1


DEFAULT_RESOURCES = (ResourceSpec("cpu", 1), ResourceSpec("memory", 1))


@dataclass(frozen=True)
class Policy:
    """What decides a pod's node: the scoring plugins' resources and weights, the search."""

    name: str
    strategy: str  # LeastAllocated | MostAllocated (NodeResourcesFit) | FirstFit
    fit_resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES
    fit_weight: int = 1
    balanced_resources: tuple[ResourceSpec, ...] = ()  # empty: BalancedAllocation disabled
    balanced_weight: int = 1
    percentage_of_nodes_to_score: int = 0  # 0: the adaptive share

    @property
    def max_score(self) -> int:
        return MAX_NODE_SCORE * (self.fit_weight + (self.balanced_weight
                                                    if self.balanced_resources else 0))


def default_policy() -> Policy:
    """kube-scheduler's default profile: LeastAllocated and BalancedAllocation over cpu, memory."""
    return Policy("default", LEAST_ALLOCATED, DEFAULT_RESOURCES, 1, DEFAULT_RESOURCES, 1, 0)


def first_fit_policy() -> Policy:
    return Policy("first-fit", FIRST_FIT, (), 0, (), 0, 100)


def policy_from_config(config: Mapping, name: str = "gpulease") -> Policy:
    """The Policy of a KubeSchedulerConfiguration dict's first profile (as kube-scheduler
    defaults what it leaves out); ValueError for what this model does not cover."""
    profile = config["profiles"][0]
    plugins = profile.get("plugins", {})
    disabled = {p["name"] for point in ("score", "multiPoint")
                for p in plugins.get(point, {}).get("disabled", [])}
    if "*" in disabled:
        raise ValueError("a profile disabling every score plugin ('*') is not modelled")
    weights = {p["name"]: p["weight"] for point in ("score", "multiPoint")
               for p in plugins.get(point, {}).get("enabled", []) if "weight" in p}
    args = {c["name"]: c.get("args", {}) for c in profile.get("pluginConfig", [])}
    strategy = args.get(FIT, {}).get("scoringStrategy", {})
    kind = strategy.get("type", LEAST_ALLOCATED)
    if kind not in (LEAST_ALLOCATED, MOST_ALLOCATED):
        raise ValueError(f"scoringStrategy {kind!r} is not modelled "
                         f"({LEAST_ALLOCATED}, {MOST_ALLOCATED} are)")
    fit = tuple(ResourceSpec(r["name"], r.get("weight") or 1)
                for r in strategy.get("resources", ())) or DEFAULT_RESOURCES
    balanced = () if BALANCED in disabled else tuple(
        ResourceSpec(r["name"], r.get("weight") or 1)
        for r in args.get(BALANCED, {}).get("resources", ())) or DEFAULT_RESOURCES
    if FIT in disabled:
        raise ValueError(f"{FIT} disabled: the pod's resources would not be scored")
    return Policy(name, kind, fit, weights.get(FIT, 1), balanced, weights.get(BALANCED, 1),
                  int(config.get("percentageOfNodesToScore") or 0))


@dataclass
class NodeState:
    """What the scheduler's NodeInfo holds for these plugins."""

    name: str
    allocatable: Mapping[str, int]  # cpu millicores, memory bytes, pods, extended units
    requested: Mapping[str, int] = field(default_factory=dict)  # the bound pods' requests summed
    pods: int = 0


def is_scalar(resource: str) -> bool:
    """IsScalarResourceName: extended (a domain-prefixed name), hugepages-*, *kubernetes.io/*,
    attachable-volumes-*; not cpu, memory, ephemeral-storage, pods."""
    return ("/" in resource and not resource.startswith("requests.")) or \
        resource.startswith(("hugepages-", "attachable-volumes-"))


def fits(pod: Mapping[str, int], node: NodeState) -> bool:
    """NodeResourcesFit's Filter."""
    if "pods" in node.allocatable and node.pods + 1 > node.allocatable["pods"]:
        return False
    return all(q <= node.allocatable.get(r, 0) - node.requested.get(r, 0)
               for r, q in pod.items() if q)


def allocation_vectors(resources: Sequence[ResourceSpec], pod: Mapping[str, int],
                       node: NodeState) -> tuple[list[int], list[int], list[int]]:
    """(requested with the pod, allocated without it, allocatable) per resource; 0s where
    the resource is skipped (calculateNodeAllocatableRequest)."""
    requested, allocated, allocatable = ([0] * len(resources) for _ in range(3))
    for i, spec in enumerate(resources):
        want = pod.get(spec.name, 0)
        if want == 0 and is_scalar(spec.name):
            continue  # an extended resource the pod does not request: not scored
        alloc = node.allocatable.get(spec.name, 0)
        if alloc == 0:
            continue
        allocatable[i] = alloc
        allocated[i] = node.requested.get(spec.name, 0)
        requested[i] = allocated[i] + want
    return requested, allocated, allocatable


def least_requested_score(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def most_requested_score(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


def weighted_score(resources: Sequence[ResourceSpec], requested: Sequence[int],
                   allocatable: Sequence[int], strategy: str) -> int:
    """leastResourceScorer / mostResourceScorer."""
    per = least_requested_score if strategy == LEAST_ALLOCATED else most_requested_score
    total = weights = 0
    for spec, req, alloc in zip(resources, requested, allocatable, strict=True):
        if alloc == 0:
            continue
        total += per(req, alloc) * spec.weight
        weights += spec.weight
    return total // weights if weights else 0  # non-negative: Go's / is the same here


def balanced_resource_score(requested: Sequence[int], allocatable: Sequence[int]) -> int:
    fractions = [min(req / alloc, 1.0) for req, alloc in zip(requested, allocatable, strict=True)
                 if alloc]
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        mean = sum(fractions) / len(fractions)
        std = math.sqrt(sum((f - mean) * (f - mean) for f in fractions) / len(fractions))
    return int((1 - std) * MAX_NODE_SCORE)  # Go's int64() truncates toward zero, as int() does


def go_div(a: int, b: int) -> int:
    """Go's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def balanced_allocation_score(requested: Sequence[int], allocated: Sequence[int],
                              allocatable: Sequence[int]) -> int:
    with_pod = balanced_resource_score(requested, allocatable)
    without = balanced_resource_score(allocated, allocatable)
    half = MAX_NODE_SCORE // 2
    return half + go_div(half + with_pod - without, 2)


def node_score(policy: Policy, pod: Mapping[str, int], node: NodeState) -> int:
    """The node's total score for the pod: each enabled plugin's score times its weight."""
    if policy.strategy == FIRST_FIT:
        return 0
    req, _, alloc = allocation_vectors(policy.fit_resources, pod, node)
    total = policy.fit_weight * weighted_score(policy.fit_resources, req, alloc, policy.strategy)
    if policy.balanced_resources and any(pod.get(r.name, 0) for r in policy.balanced_resources):
        req, allocated, alloc = allocation_vectors(policy.balanced_resources, pod, node)
        total += policy.balanced_weight * balanced_allocation_score(req, allocated, alloc)
    return total


def num_feasible_nodes_to_find(percentage: int, num_all_nodes: int) -> int:
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all_nodes
    if percentage == 0:
        percentage = max(50 - num_all_nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(num_all_nodes * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


@dataclass(frozen=True)
class Decision:
    node: int | None  # index into the nodes, or None: unschedulable
    top: tuple[int, ...]  # the highest-scored feasible nodes searched, in scan order
    next_start: int  # nextStartNodeIndex after this cycle


def schedule(policy: Policy, pod: Mapping[str, int], nodes: Sequence[NodeState],
             start: int, rng: Random) -> Decision:
    """One scheduling cycle, node by node as the source does it (the reference model:
    bench/placement.py's indexed engine must choose as this does)."""
    n = len(nodes)
    if policy.strategy == FIRST_FIT:
        first = next((i for i, node in enumerate(nodes) if fits(pod, node)), None)
        return Decision(first, () if first is None else (first,), start)
    want = num_feasible_nodes_to_find(policy.percentage_of_nodes_to_score, n)
    feasible: list[int] = []
    processed = n
    for step in range(n):
        i = (start + step) % n
        if fits(pod, nodes[i]):
            if len(feasible) == want:  # one more than needed: the search stops
                processed = step
                break
            feasible.append(i)
    next_start = (start + processed) % n
    if not feasible:
        return Decision(None, (), next_start)
    if len(feasible) == 1:
        return Decision(feasible[0], (feasible[0],), next_start)
    scores = [node_score(policy, pod, nodes[i]) for i in feasible]
    best = max(scores)
    top = tuple(i for i, s in zip(feasible, scores, strict=True) if s == best)
    return Decision(top[rng.randrange(len(top))], top, next_start)
