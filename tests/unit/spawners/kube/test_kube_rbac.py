"""The hub's Role and ClusterRole (spawners/kube/rbac.py): docs/cluster.md shows exactly them,
and the objects made from them bind one ServiceAccount to both. (That the rules are enough
and each needed is tests/cluster/test_hub_rbac.py, on the real API server.)"""

from pathlib import Path

import yaml

from gpulease.spawners.kube.rbac import (
    DRA_CLUSTER_ROLE_RULES,
    DRA_ROLE_RULES,
    HUB_CLUSTER_ROLE_RULES,
    HUB_ROLE_RULES,
    SCHEDULER_CLUSTER_ROLES,
    grants,
    hub_rbac_objects,
    rules_of,
    scheduler_rbac_objects,
)

ROOT = Path(__file__).resolve().parents[4]


def test_docs_show_exactly_the_modules_rules():
    doc = (ROOT / "docs" / "cluster.md").read_text()
    section = doc.split("\n## Rights\n", 1)[1].split("\n## ", 1)[0]
    blocks = [yaml.safe_load(b.split("```", 1)[0]) for b in section.split("```yaml\n")[1:]]
    assert blocks == [HUB_ROLE_RULES, HUB_CLUSTER_ROLE_RULES, DRA_ROLE_RULES,
                      DRA_CLUSTER_ROLE_RULES]


def test_each_grant_is_named_once():
    for rules in (HUB_ROLE_RULES, HUB_CLUSTER_ROLE_RULES):
        assert len(set(grants(rules))) == len(grants(rules))
        assert all(rule["apiGroups"] == [""] for rule in rules)
    for rules in (DRA_ROLE_RULES, DRA_CLUSTER_ROLE_RULES):
        assert all(rule["apiGroups"] == ["resource.k8s.io"] for rule in rules)
    every = [*HUB_ROLE_RULES, *HUB_CLUSTER_ROLE_RULES, *DRA_ROLE_RULES, *DRA_CLUSTER_ROLE_RULES]
    assert len(set(grants(every))) == len(grants(every))
    assert grants(rules_of(grants(HUB_ROLE_RULES))) == grants(HUB_ROLE_RULES)
    # rules_of keeps each grant's API group, so a DRA grant removed in turn stays DRA's
    assert rules_of(grants(DRA_CLUSTER_ROLE_RULES))[0]["apiGroups"] == ["resource.k8s.io"]


def test_dra_mode_grows_the_roles_by_the_dra_rules_only():
    plain = {o["kind"]: o for o in hub_rbac_objects("jhub")}
    dra = {o["kind"]: o for o in hub_rbac_objects("jhub", dra=True)}
    assert dra["Role"]["rules"] == plain["Role"]["rules"] + DRA_ROLE_RULES
    assert dra["ClusterRole"]["rules"] == plain["ClusterRole"]["rules"] + DRA_CLUSTER_ROLE_RULES


def test_the_objects_bind_one_account_to_both_roles():
    objects = {o["kind"]: o for o in hub_rbac_objects("jhub")}
    assert objects["Role"]["rules"] == HUB_ROLE_RULES
    assert objects["ClusterRole"]["rules"] == HUB_CLUSTER_ROLE_RULES
    account = {"kind": "ServiceAccount", "name": "gpulease-hub", "namespace": "jhub"}
    for binding, role in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        assert objects[binding]["subjects"] == [account]
        assert objects[binding]["roleRef"]["name"] == objects[role]["metadata"]["name"]
    assert "namespace" not in objects["ClusterRole"]["metadata"]
    assert objects["ClusterRole"]["metadata"]["name"] == "gpulease-hub-jhub"


def test_the_packing_scheduler_holds_the_bootstrap_roles_and_its_own_lease_by_name():
    # That these are enough is tests/cluster/test_packing_scheduler.py (it takes its Lease,
    # serves /configz to the cluster's client certificates and binds pods).
    objects = scheduler_rbac_objects("jhub", "gpu-packer", lease_namespace="kube-system")
    account = {"kind": "ServiceAccount", "name": "gpulease-scheduler", "namespace": "jhub"}
    assert objects[0] == {"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": "gpulease-scheduler", "namespace": "jhub"}}
    bindings = [o for o in objects if o["kind"].endswith("Binding")]
    assert all(b["subjects"] == [account] for b in bindings)
    assert sorted(b["roleRef"]["name"] for b in bindings if b["kind"] == "ClusterRoleBinding") == (
        sorted(SCHEDULER_CLUSTER_ROLES))
    (role,) = [o for o in objects if o["kind"] == "Role"]
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "resourceNames": ["gpu-packer"], "verbs": ["get", "update"]}]
    reader = [b for b in bindings if b["roleRef"]["name"] == "extension-apiserver-authentication-reader"]
    assert [b["metadata"]["namespace"] for b in reader] == ["kube-system"]
    names = [o["metadata"]["name"] for o in objects if "namespace" not in o["metadata"]]
    assert all("jhub" in n for n in names)  # cluster objects of one gpulease's own
