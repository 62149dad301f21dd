"""The hub's rights on the cluster: one Role in the users' namespace, one ClusterRole.

The one place these rules are written (docs/cluster.md shows them; the Helm
chart and `tests/cluster` build the Role and ClusterRole from here). Each is
needed and together they are enough for what the hub does with
GPUKubeSpawner: tests/cluster/test_hub_rbac.py runs a start, the server's
first answer, a poll, the pod's events, a stop and the home claim (made on a
first start; read back when the namespace's claim quota is full) with a
ServiceAccount token holding exactly these rules, then with each single
grant (a verb on a resource) removed, and each removal fails it with a 403
naming that grant.

Who needs what:

- pods create, delete (namespaced): kubespawner makes and deletes each
  server's pod. It never reads one pod by name: its poll and its wait for
  the pod read the pod watch.
- persistentvolumeclaims create, get: a user's home claim is made on their
  first start; when the create is refused with 403 (the namespace's claim
  quota is full, the claim made long ago) kubespawner reads the claim, and
  goes on if it exists. Claims are never listed, watched or deleted
  (`delete_forever` keeps the home).
- events list, watch: kubespawner's event watch, the progress a waiting user
  sees (scheduling, image pull).
- nodes and pods list, watch, cluster-wide (HUB_CLUSTER_ROLE_RULES, the
  cluster inventory's CLUSTER_RULES): admission counts every node's GPUs and
  every pod holding some, in any namespace; kubespawner's own pod watch of
  the users' namespace is covered by the same grant, so the Role holds no
  pod list or watch of its own.

In DRA mode (GPUKubeSpawner.gpu_allocation = "dra") they grow by DRA_ROLE_RULES
and DRA_CLUSTER_ROLE_RULES, and by nothing else:

- resourceclaimtemplates create, get, list, delete (namespaced): the hub makes
  a profile's template before a start's pod; a create answered 409 reads the
  one of that name, used only if it is gpulease's and asks for exactly the
  profile's devices; it lists its own to prune, and deletes those no pod
  names (spawners/kube/dra_templates.py).
- resourceslices and resourceclaims list, watch, cluster-wide: the inventory's
  devices and who holds them; claims of every namespace hold devices, as pods
  of every namespace do (spawners/kube/cluster_watch.py DRA_CLUSTER_RULES).
- deviceclasses get, cluster-wide: a start checks once that the DeviceClass
  its template asks from exists (NVIDIA's DRA driver installed), and says so
  instead of leaving the pod Pending.

The generated ResourceClaims themselves are made and deleted by the
controller-manager's resourceclaim controller, not the hub.
"""

from __future__ import annotations

from gpulease.spawners.kube.cluster_watch import CLUSTER_RULES, DRA_CLUSTER_RULES

HUB_ROLE_RULES: list[dict] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["create", "get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch"]},
]
HUB_CLUSTER_ROLE_RULES: list[dict] = CLUSTER_RULES  # the inventory's watches (one list)
DRA_ROLE_RULES: list[dict] = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
     "verbs": ["create", "get", "list", "delete"]},
]
DRA_CLUSTER_ROLE_RULES: list[dict] = DRA_CLUSTER_RULES + [
    {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["get"]},
]
RBAC_API = "rbac.authorization.k8s.io/v1"


def grants(rules: list[dict]) -> list[tuple[str, str]]:
    """Every (resource, verb) a list of rules grants, in order."""
    return [(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]]


def rules_of(granted: list[tuple[str, str]]) -> list[dict]:
    """Rules granting exactly `granted`, one (resource, verb) a rule (the core API group,
    or resource.k8s.io for DRA's resources)."""
    return [{"apiGroups": [_group(r)], "resources": [r], "verbs": [v]} for r, v in granted]


def _group(resource: str) -> str:
    dra = {r for rule in DRA_ROLE_RULES + DRA_CLUSTER_ROLE_RULES for r in rule["resources"]}
    return "resource.k8s.io" if resource in dra else ""


def hub_role_rules(dra: bool = False) -> list[dict]:
    return HUB_ROLE_RULES + (DRA_ROLE_RULES if dra else [])


def hub_cluster_role_rules(dra: bool = False) -> list[dict]:
    return HUB_CLUSTER_ROLE_RULES + (DRA_CLUSTER_ROLE_RULES if dra else [])


def hub_rbac_objects(namespace: str, account: str = "gpulease-hub",
                     dra: bool = False) -> list[dict]:
    """The ServiceAccount, Role, ClusterRole and their bindings, as Kubernetes objects.

    The ClusterRole's name carries the namespace: a cluster may run more than
    one gpulease, each in a namespace of its own."""
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    cluster_name = f"{account}-{namespace}"

    def role_ref(kind: str, name: str) -> dict:
        return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": RBAC_API, "kind": "Role",
         "metadata": {"name": account, "namespace": namespace}, "rules": hub_role_rules(dra)},
        {"apiVersion": RBAC_API, "kind": "RoleBinding",
         "metadata": {"name": account, "namespace": namespace},
         "roleRef": role_ref("Role", account), "subjects": subject},
        {"apiVersion": RBAC_API, "kind": "ClusterRole",
         "metadata": {"name": cluster_name}, "rules": hub_cluster_role_rules(dra)},
        {"apiVersion": RBAC_API, "kind": "ClusterRoleBinding",
         "metadata": {"name": cluster_name},
         "roleRef": role_ref("ClusterRole", cluster_name), "subjects": subject},
    ]


# The packing scheduler (spawners/kube/scheduler_config.py) is the stock kube-scheduler
# binary: it needs what the cluster's own scheduler holds, the bootstrap ClusterRoles
# every cluster has and keeps in step with its version (system:kube-scheduler: nodes,
# pods, bindings, events, the storage and DRA objects its plugins read;
# system:volume-scheduler: PersistentVolume binding for claims that wait for their
# first consumer). Those name only the default scheduler's Lease, `kube-scheduler`:
# SCHEDULER_LEASE_RULES grant its own Lease, by its name. tests/cluster/
# test_packing_scheduler.py runs the scheduler as a ServiceAccount holding exactly
# these objects (it takes its Lease and binds pods).
SCHEDULER_CLUSTER_ROLES = ("system:kube-scheduler", "system:volume-scheduler")


def scheduler_lease_rules(scheduler_name: str) -> list[dict]:
    """Leader election on the Lease named after the scheduler (create is in
    system:kube-scheduler: a create names no object yet)."""
    return [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": [scheduler_name], "verbs": ["get", "update"]}]


def scheduler_rbac_objects(namespace: str, scheduler_name: str, lease_namespace: str,
                           account: str = "gpulease-scheduler") -> list[dict]:
    """The packing scheduler's ServiceAccount and rights, as Kubernetes objects.

    Bindings to SCHEDULER_CLUSTER_ROLES (named after the account and its
    namespace: a cluster may run more than one gpulease), a Role and RoleBinding
    for its Lease in `lease_namespace`, and a RoleBinding to kube-system's
    `extension-apiserver-authentication-reader`, which a component serving its
    own health and metrics endpoints reads its client CA from (as
    system:kube-scheduler's own binding there)."""
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    prefix = f"{account}-{namespace}"

    def ref(kind: str, name: str) -> dict:
        return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}
    objects: list[dict] = [{"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": account, "namespace": namespace}}]
    for role in SCHEDULER_CLUSTER_ROLES:
        objects.append({"apiVersion": RBAC_API, "kind": "ClusterRoleBinding",
                        "metadata": {"name": f"{prefix}-{role.split(':')[-1]}"},
                        "roleRef": ref("ClusterRole", role), "subjects": subject})
    lease_role = f"{prefix}-lease"
    objects += [
        {"apiVersion": RBAC_API, "kind": "Role",
         "metadata": {"name": lease_role, "namespace": lease_namespace},
         "rules": scheduler_lease_rules(scheduler_name)},
        {"apiVersion": RBAC_API, "kind": "RoleBinding",
         "metadata": {"name": lease_role, "namespace": lease_namespace},
         "roleRef": ref("Role", lease_role), "subjects": subject},
        {"apiVersion": RBAC_API, "kind": "RoleBinding",
         "metadata": {"name": f"{prefix}-authentication-reader", "namespace": "kube-system"},
         "roleRef": ref("Role", "extension-apiserver-authentication-reader"),
         "subjects": subject},
    ]
    return objects
