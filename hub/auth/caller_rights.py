"""Who is a gpulease admin or auditor: decided from the calling token's scopes.

The hub's identity answer (HubAuth's user model) says `admin: true` for every
token of a hub admin, however narrow: a token the admin made for a script
with only `read:users`, or the admin's own server's token
(JUPYTERHUB_API_TOKEN, which the user's code in that server can read). The
rule therefore reads the token's `scopes` (expanded, already intersected with
what its owner holds now), never the owner's flag alone, so that a token
carries no more power in gpulease than it carries in the hub:

- admin: the token holds gpulease's admin scope, or it is a hub admin's token
  that holds the hub's own power over users (`admin:users`, unfiltered): with
  it the token could make any account a hub admin, so it is one already;
- auditor: an admin, or the token holds gpulease's audit scope.

Browser logins (the service's OAuth cookie) qualify because the service's
`oauth_client_allowed_scopes` (hub/config/hub_config.py) ask for these scopes; the hub
grants each login only those its user holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The service's own scopes (hub/config/hub_config.py declares them to the hub as custom scopes).
ADMIN_SCOPE = "custom:gpulease:admin"
AUDIT_SCOPE = "custom:gpulease:audit"
# A hub admin's token counts as a gpulease admin only while it holds this
# hub power itself: not a narrowed one.
HUB_ADMIN_SCOPE = "admin:users"


def token_scopes(model: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(model.get("scopes") or ())


def has_hub_admin_powers(model: Mapping[str, Any]) -> bool:
    """A hub admin's token that may act as one in the hub itself."""
    return bool(model.get("admin")) and HUB_ADMIN_SCOPE in token_scopes(model)


def is_gpulease_admin(model: Mapping[str, Any]) -> bool:
    return ADMIN_SCOPE in token_scopes(model) or has_hub_admin_powers(model)


def is_gpulease_auditor(model: Mapping[str, Any]) -> bool:
    return is_gpulease_admin(model) or AUDIT_SCOPE in token_scopes(model)
