"""The end-to-end tests' shared fixtures: a module's one real hub, its users and its admin.

A module that needs a hub of its own kind says so by defining `hub_options`, a module
fixture returning tests/support/hubproc.py's HubOptions (its profiles, inventory,
the mock servers' catalog, config, arguments, users and groups); `hub` starts that hub once for the
module, with its users made and its groups joined, and closes it after the module.
`admin` is the hub admin's token. Modules whose hubs need more (two hubs, an identity
provider, a root hub's accounts) keep their own `hub` fixture, which overrides this one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.hubproc import ADMIN_PW, HubOptions, HubProcess, password_of


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    """The module's hub: the sample profiles and inventory, no users (override it)."""
    return HubOptions()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, request, hub_options: HubOptions) -> Iterator[HubProcess]:
    """The module's hub, started with `hub_options`; `hub.admin_token` is its admin's."""
    base = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW,
                   extra_args=hub_options.arguments(base)).start()
    try:
        h.admin_token = h.token_for("admin", ADMIN_PW)
        for name in hub_options.users:
            r = h.service("POST", "api/users", h.admin_token,
                          {"name": name, "password": password_of(name)})
            assert r.status_code == 201, r.text
        for group, members in hub_options.groups.items():
            h.join_group(h.admin_token, group, list(members))
    except BaseException:
        h.close()
        raise
    yield h
    h.close()


@pytest.fixture(scope="module")
def admin(hub: HubProcess) -> str:
    """The hub admin's API token."""
    assert hub.admin_token, "this module's own hub fixture minted no admin token"
    return hub.admin_token
