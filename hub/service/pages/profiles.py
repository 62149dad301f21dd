"""Admin pages: the profiles editor (list, create, edit, delete with confirmation).

Forms post plain HTML (no JavaScript); a submitted form becomes the same body
as `PUT api/profiles/{slug}` and goes through the same `parse_profile`, so the
page accepts exactly what the API accepts. Changes are audit-logged by the
profile store in the change's own transaction (`upsert`/`delete` with `actor`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tornado import web

from gpulease.core.model.profiles import (
    SLUG,
    FieldError,
    ProfileError,
    parse_profile,
    servers_saving,
)
from gpulease.hub.service.api.profiles import ProfileHandler
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.pages import forms as af
from gpulease.hub.service.pages.admin_base import AdminPage

_OUTCOMES = {"created": "created", "updated": "saved", "unchanged": "saved (nothing changed)",
             "deleted": "deleted"}


class ProfilesPage(AdminPage):
    @web.authenticated
    async def get(self):
        self.viewer()
        profiles = await asyncio.to_thread(self.ctx.profiles.list, True)
        slug, outcome = self.get_argument("slug", ""), self.get_argument("outcome", "")
        message = (f"Profile {slug} {_OUTCOMES[outcome]}."
                   if SLUG.fullmatch(slug) and outcome in _OUTCOMES else "")
        self.render("admin_profiles.html", rows=[af.profile_row(p) for p in profiles],
                    message=message)


class _ProfileFormPage(AdminPage):
    def show_form(self, values: dict[str, Any], slug: str | None,
                  errors: Sequence[FieldError] = (), status: int = 200) -> None:
        by_input, other = af.field_errors(errors)
        self.set_status(status)
        self.render("admin_profile_form.html", values=values, slug=slug, errors=by_input,
                    other_errors=other, catalog=self.ctx.catalog.images,
                    gpu_models=af.GPU_MODELS, mig_names=af.MIG_NAMES,
                    tier_prices=af.tier_price_inputs())

    async def save(self, slug: str | None) -> None:
        """Validate the posted form; save and redirect, or show it again with its errors."""
        actor = self.editor()
        form = self.form()
        body, errors = af.profile_body(form, self.ctx.catalog, slug)
        profile = None
        try:
            profile = parse_profile(body, self.ctx.catalog, slug=slug)
        except ProfileError as e:
            errors = [*errors, *e.errors]
        store = self.ctx.profiles
        if slug is None and profile is not None and await asyncio.to_thread(
                store.exists, profile.slug):
            errors.append(FieldError("slug", f"a profile {profile.slug} exists already: "
                                             "choose another slug, or edit that profile"))
        if slug is not None and not await asyncio.to_thread(store.exists, slug):
            raise APIError(404, f"No profile {slug} (deleted meanwhile?)")
        if errors or profile is None:
            self.show_form(af.submitted_values(form, slug), slug, errors, 400)
            return
        try:
            outcome = await asyncio.to_thread(store.upsert, profile, actor=actor)
        except ProfileError as e:  # the store's own checks (same as parse_profile's)
            self.show_form(af.submitted_values(form, slug), slug, e.errors, 400)
            return
        self.see_other(f"admin/profiles?slug={profile.slug}&outcome={outcome}")


class ProfileNewPage(_ProfileFormPage):
    @web.authenticated
    async def get(self):
        self.viewer()
        self.require_admin()  # the page is nothing but a form
        source = self.get_argument("copy", "")
        profile = await asyncio.to_thread(self.ctx.profiles.get, source) if source else None
        values = af.profile_form_values(profile)
        if profile is not None:  # a copy: same settings, a name of its own
            values.update(slug="", display_name=f"{profile.display_name} (copy)")
        self.show_form(values, None)

    async def post(self):
        await self.save(None)


class ProfileEditPage(_ProfileFormPage):
    async def _profile(self, slug: str):
        profile = await asyncio.to_thread(self.ctx.profiles.get, slug)
        if profile is None:
            raise APIError(404, f"No profile {slug}")
        return profile

    @web.authenticated
    async def get(self, slug: str):
        self.viewer()
        self.show_form(af.profile_form_values(await self._profile(slug)), slug)

    async def post(self, slug: str):
        await self.save(slug)


class ProfileDeletePage(AdminPage):
    @web.authenticated
    async def get(self, slug: str):
        self.viewer()
        self.require_admin()  # a confirmation form only
        await self._confirm(slug, await self._users_of(slug))

    async def post(self, slug: str):
        actor = self.editor()
        force = self.get_body_argument("force", "") in ("on", "true", "1")
        users = await self._users_of(slug)
        if users and not force:
            await self._confirm(slug, users, status=409)
            return
        if not await asyncio.to_thread(self.ctx.profiles.delete, slug, actor=actor):
            raise APIError(404, f"No profile {slug}")
        self.see_other(f"admin/profiles?slug={slug}&outcome=deleted")

    async def _confirm(self, slug: str, users: list[dict[str, str]], status: int = 200):
        if not await asyncio.to_thread(self.ctx.profiles.exists, slug):
            raise APIError(404, f"No profile {slug}")
        profile = await asyncio.to_thread(self.ctx.profiles.get, slug)
        self.set_status(status)
        self.render("admin_profile_delete.html", slug=slug,
                    row=af.profile_row(profile) if profile else None, users=users,
                    refused=status == 409)

    async def _users_of(self, slug: str) -> list[dict]:
        """Servers whose saved options name the profile: the API's own check (409)."""
        users = await ProfileHandler._all_users(self)  # only needs self.hub_api
        return servers_saving(users, slug)


ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"admin/profiles", ProfilesPage),
    (r"admin/profiles/new", ProfileNewPage),
    (r"admin/profiles/edit/([a-z0-9-]+)", ProfileEditPage),
    (r"admin/profiles/delete/([a-z0-9-]+)", ProfileDeletePage),
]
