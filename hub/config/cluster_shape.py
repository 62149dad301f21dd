"""What `gpulease up` needs to know of the cluster shape (GPULeaseHub.shape = cluster).

The embedded shape runs servers as local processes (LocalGPUSpawner) and
checks this host: NVML or a declared inventory, Unix accounts, cgroups, the
servers' environment, homes in the state folder. The cluster shape runs one
pod per server (GPUKubeSpawner) and checks none of that: Kubernetes holds the
GPUs, the homes (one claim per user) and the isolation. Here are the few
decisions of its own, as plain functions.
"""

from __future__ import annotations

from pathlib import Path

from traitlets.config import Config

from gpulease.host.state import StateError

SPAWNER_CLASS = "gpulease.spawners.kube.GPUKubeSpawner"
# Where Kubernetes mounts a pod's ServiceAccount namespace (kubespawner's own default).
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
INSTALL_HINT = ("make install in the clone, or pip install -e '<clone>[cluster]' "
                "(the cluster extra: kubespawner)")


def require_kubespawner() -> None:
    """A clear refusal to start when the cluster shape's spawner cannot be imported."""
    try:
        import kubespawner  # noqa: F401 - the hub imports it as its spawner class
    except ImportError as e:
        raise StateError(
            "GPULeaseHub.shape is 'cluster', which needs kubespawner (jupyterhub-kubespawner), "
            f"and it cannot be imported ({e}): {INSTALL_HINT}") from None


def cluster_spawner_classes() -> list[type]:
    """GPUKubeSpawner, for --help-all, when kubespawner (gpulease[cluster]) is installed."""
    try:
        from gpulease.spawners.kube.spawner import GPUKubeSpawner
    except ImportError:
        return []
    return [GPUKubeSpawner]


def resolve_namespace(configured: str, user_config: Config,
                      service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The servers' namespace: GPULeaseHub.cluster_namespace, else the hub pod's own, else
    'default'. The spawner and the gpulease service (its inventory) must see one namespace:
    a GPUKubeSpawner.namespace of the admin's own that differs is refused."""
    namespace = configured
    if not namespace:
        try:
            namespace = service_account_file.read_text().strip()
        except OSError:
            namespace = ""
    namespace = namespace or "default"
    for section in ("GPUKubeSpawner", "KubeSpawner"):
        theirs = user_config[section].get("namespace") if section in user_config else None
        if theirs is not None and theirs != namespace:
            raise StateError(
                f"c.{section}.namespace is {theirs!r} but the servers' namespace is "
                f"{namespace!r}: set GPULeaseHub.cluster_namespace instead (gpulease's service "
                "reads the same namespace)")
    return namespace


def spawner_nodes(user_config: Config) -> dict:
    """The nodes GPUKubeSpawner admits GPU starts to, as the admin's config sets them: its
    `node_selector` and `gpu_tolerations`, and how pods ask for GPUs (`gpu_allocation`:
    device-plugin or dra). The gpulease service counts the availability it shows
    (api/profiles) on the same nodes, from the same objects (GPULEASE_CLUSTER_NODES)."""
    from gpulease.spawners.kube.pod_spec import DEFAULT_GPU_TOLERATIONS

    nodes = {"node_selector": {}, "tolerations": [dict(t) for t in DEFAULT_GPU_TOLERATIONS]}
    for section in ("KubeSpawner", "GPUKubeSpawner"):  # the subclass's own wins
        mine = user_config[section] if section in user_config else {}
        if "node_selector" in mine:
            nodes["node_selector"] = dict(mine["node_selector"])
    theirs = user_config["GPUKubeSpawner"] if "GPUKubeSpawner" in user_config else {}
    if "gpu_tolerations" in theirs:
        nodes["tolerations"] = [dict(t) for t in theirs["gpu_tolerations"]]
    nodes["allocation"] = str(theirs.get("gpu_allocation", "device-plugin"))
    return nodes


def banner_lines(namespace: str, user_config: Config) -> list[str]:
    """What the hub says at its start in the cluster shape; a warning for each tier whose
    PriorityClass the configuration leaves unnamed (pod_spec.unmapped_priority_classes)."""
    from gpulease.spawners.kube.pod_spec import unmapped_priority_classes

    mine = user_config["GPUKubeSpawner"] if "GPUKubeSpawner" in user_config else {}
    warnings = unmapped_priority_classes(
        mine.get("on_demand_priority_class", ""), mine.get("spot_priority_class", ""),
        dict(mine.get("tier_priority_classes", {})))
    dra = mine.get("gpu_allocation", "device-plugin") == "dra"
    return [f"GPU inventory: the Kubernetes cluster's nodes (servers in namespace {namespace})"
            + (", their GPUs from NVIDIA's DRA driver's ResourceSlices" if dra else ""),
            "Servers run as pods (GPUKubeSpawner); each user's home is the claim claim-<user>",
            *(f"Warning: {line}" for line in warnings)]
