"""The rule for gpulease admins and auditors, over HubAuth's user models (no hub).

The models are shaped as the hub's `GET /hub/api/user` answers them: the
owner's `admin` flag and the token's expanded `scopes`. The same rule, on a
real hub, is in tests/e2e/test_admin_permissions.py.
"""

from __future__ import annotations

import pytest

from gpulease.hub.auth.caller_rights import (
    ADMIN_SCOPE,
    AUDIT_SCOPE,
    has_hub_admin_powers,
    is_gpulease_admin,
    is_gpulease_auditor,
)

ACCESS = "access:services!service=gpulease"
# What an admin's full token or browser login carries (expanded, shortened).
HUB_ADMIN_SCOPES = ["admin:users", "admin:auth_state", "users", "read:users", ACCESS]

CASES = [
    # (id, model, admin, auditor)
    ("hub admin, full token", {"admin": True, "scopes": HUB_ADMIN_SCOPES}, True, True),
    ("hub admin, script token read:users",
     {"admin": True, "scopes": ["read:users", ACCESS]}, False, False),
    ("hub admin, the server's own token",
     {"admin": True, "scopes": ["users:activity!user=admin", "access:servers!server=admin/",
                                ACCESS]}, False, False),
    ("hub admin, admin:users of one group only",
     {"admin": True, "scopes": ["admin:users!group=lab", ACCESS]}, False, False),
    ("hub admin, token with only gpulease's admin scope",
     {"admin": True, "scopes": [ADMIN_SCOPE, AUDIT_SCOPE, ACCESS]}, True, True),
    ("not a hub admin, admin:users by a role", {"admin": False, "scopes": HUB_ADMIN_SCOPES},
     False, False),
    ("gpulease admin by group", {"admin": False, "scopes": [ADMIN_SCOPE, ACCESS]}, True, True),
    ("auditor by group", {"admin": False, "scopes": [AUDIT_SCOPE, ACCESS]}, False, True),
    ("researcher", {"admin": False, "scopes": ["read:users!user=alice", ACCESS]}, False, False),
    ("no scopes at all", {"admin": True}, False, False),
]


@pytest.mark.parametrize("model, admin, auditor", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_token_decides_not_the_owners_flag(model, admin, auditor):
    assert is_gpulease_admin(model) is admin
    assert is_gpulease_auditor(model) is auditor


def test_only_a_hub_admins_token_with_the_hub_power_may_act_as_a_hub_admin():
    assert has_hub_admin_powers({"admin": True, "scopes": HUB_ADMIN_SCOPES})
    assert not has_hub_admin_powers({"admin": True, "scopes": [ADMIN_SCOPE, ACCESS]})
    assert not has_hub_admin_powers({"admin": False, "scopes": HUB_ADMIN_SCOPES})
