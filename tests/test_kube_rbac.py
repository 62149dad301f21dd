"""The hub's Role and ClusterRole (spawners/kube_rbac.py): docs/cluster.md shows exactly them,
and the objects made from them bind one ServiceAccount to both. (That the rules are enough
and each needed is tests/cluster/test_hub_rbac.py, on the real API server.)"""

from pathlib import Path

import yaml

from gpulease.spawners.kube_rbac import (
    HUB_CLUSTER_ROLE_RULES,
    HUB_ROLE_RULES,
    grants,
    hub_rbac_objects,
    rules_of,
)

ROOT = Path(__file__).resolve().parent.parent


def test_docs_show_exactly_the_modules_rules():
    doc = (ROOT / "docs" / "cluster.md").read_text()
    section = doc.split("\n## Rights\n", 1)[1].split("\n## ", 1)[0]
    blocks = [yaml.safe_load(b.split("```", 1)[0]) for b in section.split("```yaml\n")[1:]]
    assert blocks == [HUB_ROLE_RULES, HUB_CLUSTER_ROLE_RULES]


def test_each_grant_is_named_once():
    for rules in (HUB_ROLE_RULES, HUB_CLUSTER_ROLE_RULES):
        assert len(set(grants(rules))) == len(grants(rules))
        assert all(rule["apiGroups"] == [""] for rule in rules)
    assert grants(rules_of(grants(HUB_ROLE_RULES))) == grants(HUB_ROLE_RULES)


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
