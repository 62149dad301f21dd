"""LocalGPUSpawner: one local JupyterLab process per server, on its placed devices.

The decisions are made elsewhere, as plain functions: which profile
(`gpulease.hub.options`), which devices (`gpulease.spawners.placement`, made
durable by `AssignmentStore`), which command and environment
(`process_spec`). This class wires them into JupyterHub's spawn path.

A start that gpulease refuses (bad options, a profile the user may not use,
no capacity) fails with an HTTP error that JupyterHub returns to the start
request, and the server's saved `user_options` are put back as they were:
JupyterHub 6.1 saves them before any spawner code runs.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import object_session
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from traitlets import Unicode, default

from gpulease.hub.context import GPULeaseContext, get_context
from gpulease.hub.db import utcnow
from gpulease.hub.ledger import LOW_BALANCE_MINUTES, minutes_left
from gpulease.hub.options import ServerChoice
from gpulease.hub.profiles import usable_by
from gpulease.hub.state import StateDir, ensure_home
from gpulease.hub.units import format_credits
from gpulease.spawners.admission import DATABASE_DOWN, apply_gpulease_options
from gpulease.spawners.options_form import options_from_form, render_options_form
from gpulease.spawners.placement import NoFit, availability
from gpulease.spawners.process_spec import build_process_spec
from gpulease.spawners.process_tree import end_processes, process_tree


class LocalGPUSpawner(LocalProcessSpawner):
    """Run each server as a local process on the GPU devices placed for it."""

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
    state_dir = Unicode(
        "",
        config=True,
        help="The state folder; homes are its homes/<user> folders, shared by a user's servers.",
    )

    gpulease_choice: ServerChoice | None = None
    gpulease_devices: tuple[str, ...] = ()
    gpulease_balance: int = 0  # the account's balance when this start was admitted
    _options_to_restore: tuple[dict | None] | None = None
    _stopping: bool = False

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return apply_gpulease_options

    @default("options_form")
    def _default_options_form(self):
        return LocalGPUSpawner._render_form

    @default("default_url")
    def _default_default_url(self):
        return "/lab"

    @property
    def gpulease(self) -> GPULeaseContext:
        return get_context(self.db_url, self.inventory_file, self.catalog_file, self.node_name)

    # --- the choice -------------------------------------------------------------

    @staticmethod
    def _render_form(spawner: LocalGPUSpawner) -> str:
        ctx = spawner.gpulease
        groups = {g.name for g in spawner.user.groups}
        profiles = [p for p in ctx.profiles.list(include_disabled=False) if usable_by(p, groups)]
        held = set(ctx.assignments.held())
        avail = {
            p.slug: availability(ctx.inventory, held, p.gpu.device_request())
            for p in profiles
            if p.gpu
        }
        orm_spawner = spawner.orm_spawner
        saved = (orm_spawner.user_options or {}).get("profile") if orm_spawner else None
        return render_options_form(profiles, avail, saved)

    def options_from_form(self, formdata):
        return options_from_form(formdata)

    def refuse(self, status: int, message: str):
        """Fail this start with `status`, restoring the saved options it replaced."""
        if self._options_to_restore is not None:
            (previous,) = self._options_to_restore
            self.orm_spawner.user_options = previous
            self.user_options = previous or {}
            session = object_session(self.orm_spawner)
            if session is not None:
                session.commit()
            self._options_to_restore = None
        raise web.HTTPError(status, message)

    # --- the process ------------------------------------------------------------

    def make_preexec_fn(self, name):
        # Servers run as the hub's own account here; per-user Unix accounts are
        # the isolation layer's job (docs/security.md).
        return None

    def user_env(self, env):
        return env

    def get_env(self):
        env = super().get_env()
        env.update(self._spec().env)
        return env

    def _spec(self):
        choice = self.gpulease_choice
        image = choice.image if choice else None
        return build_process_spec(
            user=self.user.name,
            home=StateDir(Path(self._state_root())).home_of(self.user.name),
            device_uuids=self.gpulease_devices,
            local_env=image.local_env if image else None,
            run_as_uid=os.getuid(),
            profile_slug=choice.profile.slug if choice else "",
            image_name=image.name if image else "",
        )

    def _state_root(self):
        if not self.state_dir:
            raise RuntimeError("LocalGPUSpawner.state_dir is not set")
        return self.state_dir

    async def start(self):
        choice = self.gpulease_choice
        if choice is None:  # apply_user_options always runs first in JupyterHub >= 5.3
            self.refuse(400, "No profile was resolved for this start")
        ctx = self.gpulease
        home = ensure_home(StateDir(Path(self._state_root())), self.user.name)
        if choice.profile.gpu is not None:
            try:
                placement = await asyncio.to_thread(
                    ctx.assignments.claim,
                    self.user.name,
                    self.name,
                    choice.profile.slug,
                    choice.profile.gpu.device_request(),
                    ctx.inventory,
                )
            except NoFit as nofit:
                self.refuse(nofit.status, f"Cannot start {choice.profile.slug}: {nofit.message}")
            except SQLAlchemyError as e:
                self.log.error("gpulease database error placing %s: %s", self._log_name, e)
                self.refuse(503, DATABASE_DOWN)
            self.gpulease_devices = tuple(placement.uuids)
        else:
            await asyncio.to_thread(ctx.assignments.release, self.user.name, self.name, "restart")
            self.gpulease_devices = ()
        self._options_to_restore = None
        spec = self._spec()
        self.cmd = list(spec.cmd)
        self.notebook_dir = str(home)
        self.popen_kwargs = {**self.popen_kwargs, "cwd": str(home)}
        self.log.info(
            "%s placed on %s", self._log_name, ", ".join(self.gpulease_devices) or "no GPU"
        )
        try:
            ip, port = await super().start()
            if await self._wait_until_answering(ip, port):
                await self._open_session(choice)
            return ip, port
        except BaseException:
            await self._release("server_died")
            raise

    async def _wait_until_answering(self, ip: str, port: int) -> bool:
        """Return as soon as the server answers HTTP (True), or its process ended.

        Billing starts at that answer. It also saves time: JupyterHub's own
        readiness check tries once at once, then backs off with growing random
        delays while JupyterLab starts; returning only when the server answers
        lets its first try succeed (about a second per spawn, bench/spawn.py).
        """
        client = AsyncHTTPClient()
        url = f"http://{ip}:{port}{self.server.base_url}api"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.http_timeout
        while loop.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False  # died: JupyterHub's own check reports it
            try:
                await client.fetch(url, raise_error=False, request_timeout=2, connect_timeout=1)
                return True
            except OSError:
                await asyncio.sleep(0.05)
        return False

    async def _open_session(self, choice: ServerChoice) -> None:
        try:  # a suspended notice lasts until the server runs again
            await asyncio.to_thread(self.gpulease.notices.server_started, self.user.name, self.name)
        except SQLAlchemyError as e:
            self.log.warning("could not clear the notices of %s: %s", self._log_name, e)
        meter = self.gpulease.meter
        if meter is None:  # not under `gpulease up` (no metering configured)
            return
        profile = choice.profile
        try:
            await asyncio.to_thread(
                meter.open, self.user.name, self.name, profile.slug, choice.account,
                profile.price_per_hour_ucr, utcnow(),
            )
        except SQLAlchemyError as e:
            self.log.error("cannot open the billing session of %s: %s", self._log_name, e)
            raise web.HTTPError(503, DATABASE_DOWN) from None

    async def progress(self):
        choice = self.gpulease_choice
        if choice is None:
            return
        profile = choice.profile
        price = format_credits(profile.price_per_hour_ucr)
        yield {"progress": 10,
               "message": f"Starting {profile.display_name} ({choice.image.name}) at "
                          f"{price} credits/h, charged to {choice.account}"}
        left = minutes_left(self.gpulease_balance, profile.price_per_hour_ucr)
        if left is not None and left < LOW_BALANCE_MINUTES:
            yield {"progress": 20,
                   "message": f"Low balance: {format_credits(self.gpulease_balance)} credits on "
                              f"{choice.account}, about {left} min at this price. The server "
                              "stops when the balance reaches zero."}

    async def stop(self, now=False):
        # LocalProcessSpawner.stop polls while it waits for the process to end:
        # that exit is this stop's doing, not a death.
        self._stopping = True
        leftovers = process_tree(self.pid)
        try:
            await super().stop(now=now)
        finally:
            self._stopping = False
            # What the user started (a background training run, a terminal's
            # jobs) must not outlive the server and keep using a GPU that is
            # handed to someone else next.
            await asyncio.to_thread(end_processes, leftovers)
            # A stop through JupyterHub's own API or pages counts as the user's;
            # gpulease's api/stop records its reason on the session beforehand.
            await self._release("user")

    async def poll(self):
        # LocalProcessSpawner.poll clears the state (and so our devices) when
        # the process is gone: look before it does.
        held = self.gpulease_devices
        status = await super().poll()
        meter = self.gpulease.meter
        if status is None:
            if meter is not None:
                meter.mark_alive(self.user.name, self.name)
        elif self._stopping:
            pass
        elif held or (meter is not None and (self.user.name, self.name) in meter.live):
            await self._release("server_died")
        return status

    async def _release(self, reason: str) -> None:
        """Release the devices and close the billing session, with the stop's reason."""
        ctx = self.gpulease
        user, server = self.user.name, self.name
        self.gpulease_devices = ()
        if ctx.meter is not None:
            await asyncio.to_thread(ctx.meter.close, user, server, reason)
        try:
            await asyncio.to_thread(ctx.assignments.release, user, server, reason)
        except SQLAlchemyError as e:
            # The server is stopped all the same; its devices are released as
            # soon as the database answers again (and at the latest at restart).
            self.log.error("cannot release the devices of %s yet: %s", self._log_name, e)
            if ctx.meter is not None:
                ctx.meter.deferred.append(
                    lambda: ctx.assignments.release(user, server, reason))

    # --- state across hub restarts -------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.gpulease_devices:
            state["gpulease_devices"] = list(self.gpulease_devices)
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpulease_devices = tuple(state.get("gpulease_devices", ()))

    def clear_state(self):
        super().clear_state()
        self.gpulease_devices = ()
