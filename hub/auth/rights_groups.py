"""At start: the groups that give rights, and a GitHub hub's refusal of those GitHub never gives.

Groups give rights in five places: GPULeaseHub.admin_groups and auditor_groups (the
gpulease-admin and gpulease-auditor roles), the authenticator's own admin_groups and
allowed_groups (oauthenticator's), profiles' groups and spot_groups (who may start them),
and group accounts (`group:NAME`, charged by NAME's members). With GitHub sign-in only
the allowed organisations and their teams are groups (gpulease.hub.auth.github): a
group of another name would be given to whoever makes a GitHub organisation of that
name, so the hub refuses to start, naming each (docs/auth.md, "GitHub"); a group account,
which the ledger keeps for ever, is named in a warning instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from gpulease.core.model.profiles import Profile
from gpulease.hub.auth.github import GPULeaseGitHubAuthenticator


def rights_groups(admin_groups: Iterable[str], auditor_groups: Iterable[str], authenticator,
                  profiles: Iterable[Profile], group_accounts: Iterable[str]
                  ) -> dict[str, list[str]]:
    """Where each group that gives rights is configured → its groups (empty ones left out)."""
    name = type(authenticator).__name__
    found: dict[str, list[str]] = {
        "GPULeaseHub.admin_groups": list(admin_groups),
        "GPULeaseHub.auditor_groups": list(auditor_groups),
        # gpulease sets the authenticator's admin_groups from GPULeaseHub's: named once
        f"{name}.admin_groups": sorted(set(getattr(authenticator, "admin_groups", ()) or ())
                                       - set(admin_groups)),
        f"{name}.allowed_groups": sorted(getattr(authenticator, "allowed_groups", ()) or ()),
    }
    for p in profiles:
        found[f"profile {p.slug} (groups)"] = list(p.groups)
        found[f"profile {p.slug} (spot_groups)"] = list(p.spot_groups)
    for account in group_accounts:
        found[f"group account {account}"] = [account.partition(":")[2]]
    return {where: groups for where, groups in found.items() if groups}


def refuse_unproducible_groups(app) -> None:
    """A GitHub hub (GPULeaseHub `app`) whose rights name a group GitHub never gives stops
    here, before anything is served, naming each; other sign-ins pass."""
    auth = app.authenticator
    if not isinstance(auth, GPULeaseGitHubAuthenticator):
        return
    ctx = app._ctx
    problems = auth.refused_rights_groups(rights_groups(
        app.admin_groups, app.auditor_groups, auth, ctx.profiles.list(), ()))
    # A group account is a ledger row, kept for ever: refusing it would stop every later
    # start (an admin's grant to group:Lab, an organisation no longer allowed), and as no
    # GitHub user is ever given its group, no one can charge it. Said, not refused.
    for line in auth.refused_rights_groups(rights_groups(
            (), (), None, (), ctx.ledger.group_accounts())):
        app.log.warning("%s: no one can charge it.", line.split(". Name an allowed")[0])
    if any(line.startswith("profile ") for line in problems):
        problems.append("A profile's groups (the admin page's edits too, kept in the database "
                        "until the profiles file changes) are corrected in the profiles file "
                        "(GPULeaseHub.profiles_file, `gpulease up --profiles`), applied at the "
                        "next start.")
    if problems:
        print("gpulease: cannot start:\n  " + "\n  ".join(problems), file=sys.stderr, flush=True)
        app._undo_prepare()
        app.exit(1)
