"""GPULeaseSpawnCore: what every gpulease spawner does, whatever runs the server.

A mixin placed before the JupyterHub spawner it extends (LocalProcessSpawner
for LocalGPUSpawner; KubeSpawner for the cluster shape). It holds the part
of the spawn path that is the same in both shapes:

- the start form, a start's options and their restore when it is refused
  (`apply_user_options` is gpulease.spawners.start.admission's: profile, rights,
  credit, CPU-only totals);
- one way to refuse a start (`refuse`, a gpulease.core.refusal.Refusal);
- the progress a waiting user sees (the choice, the balance, the queue);
- billing from the server's launch, the wait for its first answer and a start
  its own code failed (LaunchBilling, spawners/start/launch_billing.py);
- the notices that go with a start.

A subclass adds what differs: where the server runs and how it is admitted
to capacity (`start`), and what LaunchBilling asks of it (whether this run
is still the one being started, how its end is watched, how a start that
does not answer is killed). The core imports the model and billing core and
no spawner.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from jupyterhub.utils import url_escape_path, url_path_join
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import object_session
from traitlets import Unicode, default

from gpulease.core.policy.options import ServerChoice, withdrawn_after_waiting
from gpulease.core.refusal import Refusal
from gpulease.spawners.context import GPULeaseContext, get_context
from gpulease.spawners.http_error import http_error
from gpulease.spawners.hub_log import join_hub_log
from gpulease.spawners.queueing.base import QueueBase, Refused, queue_progress
from gpulease.spawners.queueing.pending import register, register_collector
from gpulease.spawners.queueing.runner import runner_for
from gpulease.spawners.start.admission import DATABASE_DOWN, apply_gpulease_options, start_events
from gpulease.spawners.start.admission_options import AdmissionOptions
from gpulease.spawners.start.launch_billing import LaunchBilling
from gpulease.spawners.start.options_form import (
    options_from_form,
    refuse_query_start,
    render_options_form,
)
from gpulease.spawners.start.spawn_page import AvailabilityOf, spawn_form_data


class GPULeaseSpawnCore(LaunchBilling, AdmissionOptions):
    """The shared spawn path (see the module doc); its queue and limit options are
    AdmissionOptions'."""

    db_url = Unicode(
        "",
        config=True,
        help="gpulease's database (profiles, device assignments). Set by `gpulease up`.",
    )
    inventory_file = Unicode(
        "",
        config=True,
        help="Declared inventory file (YAML) to use instead of NVML; empty: NVML on this host.",
    )
    catalog_file = Unicode(
        "", config=True, help="Image catalog (YAML); empty: the catalog shipped with gpulease."
    )
    node_name = Unicode("local", config=True, help="Name of this host in the inventory.")
    gpulease_choice: ServerChoice | None = None
    gpulease_balance: int = 0  # the account's balance when this start was admitted
    _options_to_restore: tuple[dict | None] | None = None
    _stopping: bool = False
    _gpulease_admitted: bool = False  # this start is past the limits and the queue
    gpulease_admitted_at: float | None = None  # monotonic; this start's admission

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        join_hub_log(self.log)
        register_collector()
        register(self)

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return apply_gpulease_options

    @default("options_form")
    def _default_options_form(self):
        return GPULeaseSpawnCore._render_form

    @default("default_url")
    def _default_default_url(self):
        return "/lab"

    @property
    def gpulease(self) -> GPULeaseContext:
        return get_context(self.db_url, self.inventory_file, self.catalog_file, self.node_name)

    # --- the choice -------------------------------------------------------------

    @staticmethod
    async def _render_form(spawner: GPULeaseSpawnCore) -> str:
        # Read the hub's ORM here, on the loop; start/spawn_page.py gathers the rest from
        # gpulease's database in a thread, so a busy database stalls only this page.
        groups = {g.name for g in spawner.user.groups}
        orm_spawner = spawner.orm_spawner
        saved = dict(orm_spawner.user_options or {}) if orm_spawner else {}
        availability = await spawner._form_availability()
        data = await asyncio.to_thread(spawn_form_data, spawner.gpulease, spawner.user.name,
                                       groups, saved, availability)
        # the "Which profile does my work need?" panel asks the hub (hub/web/recommend.py)
        # for the user whose spawn page this is (an admin may be on another user's)
        recommend_url = url_path_join(spawner.hub.base_url, "gpulease/recommend",
                                      url_escape_path(spawner.user.name))
        return render_options_form(dataclasses.replace(data, recommend_url=recommend_url))

    async def _form_availability(self) -> AvailabilityOf | None:
        """What the start form shows free per GPU request; None: this host's devices
        (the embedded shape). The cluster shape's spawner answers from the cluster."""
        return None

    def options_from_form(self, formdata):
        return options_from_form(formdata)

    def options_from_query(self, query_data):
        return refuse_query_start(query_data)  # a link starts nothing (start/options_form.py)

    def refuse(self, refusal: Refusal):
        """Fail this start with `refusal`, restoring the saved options it replaced.

        JupyterHub 6.1 saves a start's `user_options` before any spawner code
        runs (gpulease.spawners.start.admission remembers what they were)."""
        if self._options_to_restore is not None:
            (previous,) = self._options_to_restore
            self.orm_spawner.user_options = previous
            self.user_options = previous or {}
            session = object_session(self.orm_spawner)
            if session is not None:
                session.commit()
            self._options_to_restore = None
        raise http_error(refusal)

    # --- admission to capacity -------------------------------------------------------

    def _queue_runner(self) -> QueueBase:
        """The runner that admits this spawner's GPU starts (the embedded box's devices)."""
        runner = runner_for(self.gpulease, self.queue_poll_interval)
        runner.spot_grace_s = self.spot_grace_period
        return runner

    async def _admit(self, choice: ServerChoice):
        """Limits, then capacity now or a place in the queue (the shape's runner); refused
        with the runner's status and message, naming the profile."""
        profile = choice.profile
        # Read the hub's ORM here, on the event loop's thread.
        groups = {g.name: {u.name for u in g.users} for g in self.user.groups}
        self.gpulease_admitted_at = None
        try:
            admitted = await self._queue_runner().admit(
                self.user.name, self.name, profile.slug, profile.gpu.device_request(choice.image),
                user_groups=set(groups), group_members=groups,
                max_wait=self.queue_max_wait, max_length=self.queue_max_length,
                max_per_user=self.queue_places_per_user, tier=choice.tier,
                reservation=choice.reservation_id,
            )
            if admitted.queued:  # the queue may have been long: is the profile still theirs?
                await self._still_usable_after_waiting(choice)
            self.gpulease_admitted_at = time.monotonic()  # pending from here (queueing/pending.py)
            return admitted
        except Refused as refused:
            self.refuse(Refusal(f"Cannot start {profile.slug}: {refused.message}",
                                status=refused.status))
        except SQLAlchemyError as e:
            self.log.error("gpulease database error placing %s: %s", self._log_name, e)
            self.refuse(Refusal(DATABASE_DOWN, status=503))

    async def _still_usable_after_waiting(self, choice: ServerChoice) -> None:
        """Refuse (403) a start that waited in the queue if its user may no longer use its
        profile (or its tier) as the profile is now: groups come from the identity
        provider, asked again now (the user may have left the page that kept refreshing
        them), and the admin may have disabled or restricted the profile meanwhile."""
        groups = await self._groups_now()
        slug = choice.profile.slug
        if groups is None:
            found = ("profile", "your sign-in is no longer valid; sign in again")
        else:
            now = await asyncio.to_thread(self.gpulease.profiles.get, slug)
            found = withdrawn_after_waiting(now, slug, groups, choice.tier)
        if found is not None:
            field, why = found
            await self._queue_runner().give_back(self.user.name, self.name)
            self.refuse(Refusal.of_field(field, f"Cannot start {slug} after waiting in the "
                                         f"queue: {why}", status=403))

    async def _groups_now(self) -> set[str] | None:
        """The user's groups, refreshed from the authenticator when it manages them; None
        when it says the user must sign in again. A provider out of reach keeps them."""
        auth = getattr(self, "authenticator", None)
        if auth is not None and getattr(auth, "manage_groups", False) and auth.enable_auth_state:
            refreshed = await auth.refresh_user(self.user)
            if refreshed is False or refreshed is None:
                return None
            if isinstance(refreshed, dict):
                if "groups" in refreshed:
                    self.user.sync_groups(refreshed["groups"])
                if refreshed.get("auth_state"):
                    await self.user.save_auth_state(refreshed["auth_state"])
        return {g.name for g in self.user.groups}

    # --- what a waiting user sees ----------------------------------------------------

    async def progress(self):
        async for event in self._admission_progress():
            yield event
        while self._spawn_pending and self.gpulease_launched_at is None:
            await asyncio.sleep(0.05)
        event = self._billed_since_event()
        if event is not None:
            yield event

    async def _admission_progress(self):
        """The choice, the balance, the queue: what a start shows until it is admitted."""
        # A stream opened as the start is asked for (a warm start is ready in half a
        # second) comes before the options are resolved: wait for them, not end empty.
        choice = self.gpulease_choice
        while choice is None and self._spawn_pending:
            await asyncio.sleep(0.02)
            choice = self.gpulease_choice
        if choice is None:
            return
        for event in start_events(choice, self.gpulease_balance):
            yield event
        profile = choice.profile
        if profile.gpu is not None:
            async for event in queue_progress(
                self._queue_runner(), self.user.name, self.name,
                profile.gpu.device_request().describe(),
                lambda: self._spawn_pending and not self._gpulease_admitted,
            ):
                yield event
