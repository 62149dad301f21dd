"""JupyterHub's user API, refusing names outside gpulease's rule before anything is written.

JupyterHub's `POST /hub/api/users/{name}` writes the user row first and asks
the authenticator (`add_user` → `validate_username`) only afterwards,
deleting the row again on a refusal, so that for a moment `..` or `a/..` is
a user other requests can see; `POST /hub/api/users` (the admin page's "Add
Users") and `PATCH /hub/api/users/{name}` (a rename) check first but answer
"Invalid username: X" without what is allowed, and a non-string name in
`usernames` is a bare 500. These subclasses check first, with the rule's
words (gpulease.core.policy.user_names), and otherwise leave everything to
JupyterHub's own handlers, which `GPULeaseHub.init_handlers` swaps for them.
"""

from __future__ import annotations

from typing import Any

from jupyterhub.apihandlers.users import UserAPIHandler, UserListAPIHandler
from jupyterhub.scopes import needs_scope

from gpulease.core.policy.user_names import name_problem
from gpulease.core.refusal import Refusal
from gpulease.core.shown import shown
from gpulease.spawners.http_error import http_error


def _refuse_unless_valid(handler: Any, names: list[Any]) -> None:
    """400 naming every refused name and the rule, before JupyterHub writes anything."""
    problems = []
    for name in names:
        problem = name_problem(name)
        if not problem and not handler.authenticator.validate_username(name):
            problem = (f"user name {shown(name)} is refused by the authenticator's own "
                       "settings (Authenticator.username_pattern)")
        if problem:
            problems.append(problem)
    if problems:
        raise http_error(Refusal(" / ".join(problems), [("name", p) for p in problems]))


def _normalized(handler: Any, name: Any) -> Any:
    # As JupyterHub's handlers do before they validate; no lowercasing here
    # (LocalAccountsAuthenticator.normalize_username), only username_map.
    return handler.authenticator.normalize_username(name) if isinstance(name, str) else name


class CheckedUserListAPIHandler(UserListAPIHandler):
    @needs_scope("admin:users")
    async def post(self):
        data = self.get_json_body()
        names = data.get("usernames") if isinstance(data, dict) else None
        if isinstance(names, list):
            _refuse_unless_valid(self, [_normalized(self, n) for n in names])
        return await super().post()


class CheckedUserAPIHandler(UserAPIHandler):
    @needs_scope("admin:users")
    async def post(self, user_name):
        # Taken as written, as JupyterHub's own handler takes it.
        _refuse_unless_valid(self, [user_name])
        return await super().post(user_name)

    @needs_scope("admin:users")
    async def patch(self, user_name):
        data = self.get_json_body()
        if isinstance(data, dict) and "name" in data and data["name"] != user_name:
            _refuse_unless_valid(self, [_normalized(self, data["name"])])
        return await super().patch(user_name)


CHECKED = {UserListAPIHandler: CheckedUserListAPIHandler, UserAPIHandler: CheckedUserAPIHandler}


def with_checked_names(handlers: list[tuple]) -> list[tuple]:
    """JupyterHub's route list with its two user-creating handlers swapped for the checked ones."""
    return [(route[0], CHECKED.get(route[1], route[1]), *route[2:])
            if isinstance(route, tuple) and len(route) > 1 else route for route in handlers]
