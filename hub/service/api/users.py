"""api/users: an admin makes a hub user (and, embedded, their Unix account)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpulease.core.refusal import Refusal
from gpulease.hub.auth.caller_rights import (
    has_hub_admin_powers,
)
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.store.accounts import AccountError, validate_password, validate_username
from gpulease.store.identities import IdentityStore


class UsersHandler(BaseAPIHandler):
    async def post(self):
        """Create a local account and its hub user (admins only)."""
        self.require_admin()
        body = self.json_body()
        if not isinstance(body, dict):
            raise APIError(400, 'The body must be {"name": ..., "password": ..., "admin": false}')
        unknown = set(body) - {"name", "password", "admin"}
        if unknown:
            raise APIError(400, f"Unknown fields: {', '.join(sorted(unknown))}; "
                                "allowed: name, password, admin")
        errors = []
        name, password, admin = body.get("name"), body.get("password"), body.get("admin", False)
        try:
            name = validate_username(name if isinstance(name, str) else "")
        except AccountError as e:
            errors.append({"field": "name", "message": str(e)})
        try:
            validate_password(password if isinstance(password, str) else "", str(name))
        except AccountError as e:
            errors.append({"field": "password", "message": str(e)})
        if not isinstance(admin, bool):
            errors.append({"field": "admin", "message": "must be true or false"})
        if errors:
            raise APIError(400, "Invalid user", errors)
        # JupyterHub lets only a hub admin grant admin: that is asked of the
        # caller, whose own token makes the admin (docs/security.md); the
        # service itself is no hub admin.
        caller_token = self.hub_auth.get_token(self, in_cookie=False) if admin else None
        if admin and not caller_token:
            raise APIError(403, "Making a hub admin needs a hub admin's API token in the "
                                "Authorization header (the gpulease CLI sends one)",
                           [{"field": "admin", "message": "needs a hub admin's token"}])
        await self._refuse_taking_over_an_admin(name)
        bound = await asyncio.to_thread(IdentityStore(self.ctx.engine).of_user, name)
        if bound is not None:  # a password would sign in as them where local login is on
            message = (f"user name {name!r} belongs to {bound.identity.shown()}, who signs "
                       "in through the identity provider; choose another name")
            raise APIError(409, message, [{"field": "name", "message": message}])
        try:
            await asyncio.to_thread(self.ctx.accounts.create, name, password)
        except AccountError as e:
            raise APIError(409, str(e), [{"field": "name", "message": str(e)}]) from None
        try:
            await self._create_hub_user(name, caller_token)
        except Refusal:
            # Nothing half-written: without its hub user the account is useless.
            await asyncio.to_thread(self.ctx.accounts.delete, name)
            raise
        # Never the password: who created which account, and whether an admin.
        await asyncio.to_thread(self.ctx.audit.record, self.caller()["name"], "user.create",
                                f"user:{name}", None, {"name": name, "admin": admin})
        result: dict[str, Any] = {"name": name, "admin": admin}
        result.update(await asyncio.to_thread(
            make_unix_account, name, self.settings.get("gpulease_isolation", {})))
        self.write_json(result, 201)

    async def _refuse_taking_over_an_admin(self, name: str) -> None:
        """A hub user may exist without a local account (made on the hub's own
        admin page or API, or by admin_users). Giving an existing hub admin an
        account sets its password: only a hub admin may do that, as JupyterHub
        lets only admins modify admins; a gpulease admin by group may not, nor
        a hub admin's narrowed token."""
        if has_hub_admin_powers(self.caller()):
            return
        existing = await self.hub_call("GET", f"/users/{name}",
                                       doing=f"say whether user {name} exists",
                                       answers={404: lambda _: None})
        if existing and existing.get("admin"):
            raise APIError(403, f"{name} is a hub admin already: only a hub admin may give it "
                                f"a gpulease account and password, and "
                                f"{self.caller().get('name')} is not one",
                           [{"field": "name", "message": "an existing hub admin"}])

    async def _create_hub_user(self, name: str, admin_token: str | None) -> None:
        """The hub user; an admin only through `admin_token`, the calling hub admin's."""
        as_caller = {"Authorization": f"token {admin_token}"} if admin_token else None
        not_admin = {403: lambda _: Refusal(
            f"Cannot make {name} a hub admin: only a hub admin may, and "
            f"{self.caller().get('name')} is not one; create the user without admin, or ask "
            "a hub admin", [("admin", "only a hub admin may grant admin")], status=403)
        } if admin_token else {}
        made = await self.hub_call(
            "POST", f"/users/{name}", {"admin": True} if admin_token else None,
            headers=as_caller, doing=f"create user {name}",
            answers={**not_admin, 409: lambda _: None})  # a hub user of that name may exist
        if made is None and admin_token:
            await self.hub_call("PATCH", f"/users/{name}", {"admin": True}, headers=as_caller,
                                doing=f"make user {name} an admin", answers=not_admin)


def make_unix_account(name: str, isolation: dict) -> dict[str, str]:
    """The user's Unix account and home, made now rather than at the first start.

    A failure does not undo the hub user: the first start tries again and
    says why it cannot; the answer carries the reason for the CLI to show.
    """
    if not isolation.get("unix_accounts") or not isolation.get("homes"):
        return {}
    from pathlib import Path

    from gpulease.host.state import StateDir, StateError, ensure_home
    from gpulease.host.unix_accounts import (
        UnixAccountError,
        UnixAccountPolicy,
        ensure_unix_account,
        own_home,
    )

    homes = Path(isolation["homes"])
    try:
        policy = UnixAccountPolicy(isolation["unix_prefix"], isolation["unix_uid_min"],
                                   isolation["unix_uid_max"], hub_id=isolation["unix_hub_id"],
                                   adopt_unmarked=isolation["adopt_unmarked_accounts"])
        home = ensure_home(StateDir(homes.parent), name)
        account = ensure_unix_account(name, policy, home)
        own_home(home, account)
    except (UnixAccountError, StateError, OSError, KeyError) as e:
        return {"unix_account_error": str(e)}
    return {"unix_account": account.name, "uid": str(account.uid)}
