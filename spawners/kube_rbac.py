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
"""

from __future__ import annotations

from gpulease.spawners.cluster_watch import CLUSTER_RULES

HUB_ROLE_RULES: list[dict] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["create", "get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch"]},
]
HUB_CLUSTER_ROLE_RULES: list[dict] = CLUSTER_RULES  # the inventory's watches (one list)
RBAC_API = "rbac.authorization.k8s.io/v1"


def grants(rules: list[dict]) -> list[tuple[str, str]]:
    """Every (resource, verb) a list of rules grants, in order."""
    return [(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]]


def rules_of(granted: list[tuple[str, str]]) -> list[dict]:
    """Rules granting exactly `granted`, one (resource, verb) a rule (core API group)."""
    return [{"apiGroups": [""], "resources": [r], "verbs": [v]} for r, v in granted]


def hub_rbac_objects(namespace: str, account: str = "gpulease-hub") -> list[dict]:
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
         "metadata": {"name": account, "namespace": namespace}, "rules": HUB_ROLE_RULES},
        {"apiVersion": RBAC_API, "kind": "RoleBinding",
         "metadata": {"name": account, "namespace": namespace},
         "roleRef": role_ref("Role", account), "subjects": subject},
        {"apiVersion": RBAC_API, "kind": "ClusterRole",
         "metadata": {"name": cluster_name}, "rules": HUB_CLUSTER_ROLE_RULES},
        {"apiVersion": RBAC_API, "kind": "ClusterRoleBinding",
         "metadata": {"name": cluster_name},
         "roleRef": role_ref("ClusterRole", cluster_name), "subjects": subject},
    ]
