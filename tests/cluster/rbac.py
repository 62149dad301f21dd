"""ServiceAccounts, their tokens and their rights on the test cluster, for the tests.

A component under test runs with exactly a ServiceAccount's rights: a token
from the real TokenRequest API, and a RoleBinding to a Role of listed rules
(or to a ClusterRole such as `admin`) in one namespace.
"""

from __future__ import annotations

from tests.cluster.kube import Kube

RBAC = "/apis/rbac.authorization.k8s.io/v1"


def service_account_token(kube: Kube, namespace: str, account: str, seconds: int = 3600) -> str:
    """Make the ServiceAccount and return a token for it (TokenRequest)."""
    ns = f"/api/v1/namespaces/{namespace}"
    kube.create(f"{ns}/serviceaccounts", {"metadata": {"name": account}})
    return kube.create(f"{ns}/serviceaccounts/{account}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds}})["status"]["token"]


def grant(kube: Kube, namespace: str, account: str, *, rules: list[dict] | None = None,
          cluster_role: str = "") -> None:
    """Bind the account, in `namespace`, to a Role of `rules` (named after it) or a ClusterRole."""
    if rules is not None:
        kube.create(f"{RBAC}/namespaces/{namespace}/roles",
                    {"metadata": {"name": account}, "rules": rules})
    kind, name = ("ClusterRole", cluster_role) if cluster_role else ("Role", account)
    kube.create(f"{RBAC}/namespaces/{namespace}/rolebindings", {
        "metadata": {"name": account},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]})


def grant_cluster(kube: Kube, namespace: str, account: str, rules: list[dict]) -> None:
    """Bind the account, cluster-wide, to a ClusterRole of `rules` (named after its namespace:
    cluster objects outlive the test's namespace, in this run's control plane only)."""
    name = f"{namespace}-{account}"
    kube.create(f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": rules})
    kube.create(f"{RBAC}/clusterrolebindings", {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]})
