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
from datetime import datetime
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import object_session
from tornado import web
from traitlets import Bool, Dict, Integer, Unicode, default

from gpulease.hub.context import GPULeaseContext, get_context
from gpulease.hub.db import utcnow
from gpulease.hub.options import ServerChoice
from gpulease.hub.state import StateDir, StateError, ensure_home
from gpulease.hub.unix_accounts import UnixAccountError, UnixAccountPolicy
from gpulease.spawners import isolation
from gpulease.spawners.admission import DATABASE_DOWN, apply_gpulease_options, start_events
from gpulease.spawners.admission_options import AdmissionOptions
from gpulease.spawners.cgroups import CgroupError
from gpulease.spawners.exit_watch import watch_server_exit
from gpulease.spawners.first_answer import first_answer
from gpulease.spawners.options_form import (
    options_from_form,
    refuse_query_start,
    render_options_form,
)
from gpulease.spawners.process_spec import build_process_spec, filter_server_env
from gpulease.spawners.process_tree import kill_tree
from gpulease.spawners.queue_runner import Refused, queue_progress, runner_for, tell_started
from gpulease.spawners.run_end import RunEnd
from gpulease.spawners.spawn_form import spawn_form_data


class LocalGPUSpawner(AdmissionOptions, RunEnd, LocalProcessSpawner):
    """Run each server as a local process on the GPU devices placed for it.

    Its queue and per-user limit options are AdmissionOptions' (spawners/admission_options.py).
    """

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

    # --- isolation (docs/security.md); `gpulease up` sets these from GPULeaseHub's options
    unix_accounts = Bool(
        False,
        config=True,
        help="Run each user's servers as their own Unix account (created on first start; "
        "needs root). Set by `gpulease up` from GPULeaseHub.per_user_accounts.",
    )
    unix_prefix = Unicode("gl-", config=True, help="Prefix of the per-user Unix account names.")
    unix_uid_min = Integer(61000, config=True, help="Lowest uid of a per-user Unix account.")
    unix_uid_max = Integer(64999, config=True, help="Highest uid of a per-user Unix account.")
    resource_limits = Unicode(
        "none",
        config=True,
        help="How the profile's CPU and memory are enforced: systemd, cgroup2, cgroup1 or none. "
        "Set by `gpulease up` from what the host allows (GPULeaseHub.resource_limits).",
    )
    device_control = Bool(
        False,
        config=True,
        help="Let a server open only its assigned GPU device nodes (cgroup devices controller "
        "or systemd DevicePolicy). Set by `gpulease up` where the host allows it.",
    )
    device_nodes = Dict(
        config=True,
        help="Device UUID -> list of device node paths, for declared inventories (whose "
        "synthetic UUIDs have no nodes) and for tests; on NVML hosts the map comes from NVML.",
    )
    server_env = Unicode(
        "", config=True,
        help="The Python environment of servers whose image names no local_env; empty: the "
        "hub's own. Set by `gpulease up` (GPULeaseHub.server_env).",
    )

    gpulease_choice: ServerChoice | None = None
    gpulease_isolation: isolation.Prepared | None = None
    gpulease_cgroup: dict | None = None  # what to remove when the server stops (kept in state)
    gpulease_devices: tuple[str, ...] = ()
    gpulease_balance: int = 0  # the account's balance when this start was admitted
    _options_to_restore: tuple[dict | None] | None = None
    _stopping: bool = False
    _gpulease_admitted: bool = False  # this start is past the limits and the queue
    gpulease_answered_at: datetime | None = None  # this run's first HTTP answer (UTC)
    _gpulease_opening: bool = False  # its billing session is being written now
    _gpulease_watch: asyncio.Task | None = None  # waits for a late first answer
    _gpulease_unwatch = staticmethod(lambda: None)  # stops watching for its exit

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
    async def _render_form(spawner: LocalGPUSpawner) -> str:
        # Read the hub's ORM here, on the loop; spawn_form gathers the rest from
        # gpulease's database in a thread, so a busy database stalls only this page.
        groups = {g.name for g in spawner.user.groups}
        orm_spawner = spawner.orm_spawner
        saved = dict(orm_spawner.user_options or {}) if orm_spawner else {}
        data = await asyncio.to_thread(spawn_form_data, spawner.gpulease, spawner.user.name,
                                       groups, saved)
        return render_options_form(data)

    def options_from_form(self, formdata):
        return options_from_form(formdata)

    def options_from_query(self, query_data):
        return refuse_query_start(query_data)  # a link starts nothing (spawners/options_form.py)

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
        # Join the server's cgroup, then become the user's Unix account
        # (spawners/isolation.py); neither without per-user accounts and limits.
        prepared = self.gpulease_isolation
        return isolation.preexec_for(prepared) if prepared else None

    def user_env(self, env):
        return env  # HOME, USER, SHELL come from _spec: the home is the state folder's

    def get_env(self):
        env = super().get_env()
        env.update(self._spec().env)
        state = StateDir(Path(self._state_root()))
        return filter_server_env(env, isolation.SECRET_ENV, isolation.hub_secrets(state))

    def _isolation_settings(self) -> isolation.IsolationSettings:
        return isolation.IsolationSettings(
            unix_accounts=self.unix_accounts,
            policy=UnixAccountPolicy(self.unix_prefix, self.unix_uid_min, self.unix_uid_max),
            limits=self.resource_limits, devices=self.device_control,
            device_nodes=dict(self.device_nodes), state_root=self._state_root(),
            nvml=self.gpulease.inventory.source == "nvml",
        )

    def _spec(self):
        choice = self.gpulease_choice
        image = choice.image if choice else None
        prepared = self.gpulease_isolation
        account = prepared.account if prepared else None
        return build_process_spec(
            user=self.user.name,
            home=StateDir(Path(self._state_root())).home_of(self.user.name),
            device_uuids=self.gpulease_devices,
            local_env=(image.local_env if image else None) or self.server_env or None,
            run_as_uid=account.uid if account else os.getuid(),
            profile_slug=choice.profile.slug if choice else "",
            image_name=image.name if image else "",
            unix_user=account.name if account else "",
        )

    async def _isolate(self, choice: ServerChoice, home: Path) -> None:
        """The server's account and limits, before it starts; a failure fails the start."""
        profile = choice.profile
        try:
            self.gpulease_isolation = await asyncio.to_thread(
                isolation.prepare, self._isolation_settings(), self.user.name, self.name, home,
                profile.cpu, profile.memory_bytes, self.gpulease_devices,
            )
        except (UnixAccountError, CgroupError, OSError) as e:
            self.log.error("cannot isolate %s: %s", self._log_name, e)
            raise web.HTTPError(500, f"Cannot start the server: {e}") from None
        self.gpulease_cgroup = self.gpulease_isolation.state() or None

    def _state_root(self):
        if not self.state_dir:
            raise RuntimeError("LocalGPUSpawner.state_dir is not set")
        return self.state_dir

    async def start(self):
        choice = self.gpulease_choice
        if choice is None:  # apply_user_options always runs first in JupyterHub >= 5.3
            self.refuse(400, "No profile was resolved for this start")
        ctx = self.gpulease
        try:  # a name outside the rule is refused earlier (apply_gpulease_options)
            home = ensure_home(StateDir(Path(self._state_root())), self.user.name)
        except StateError as e:
            self.refuse(500, f"Cannot start the server: {e}")
        self._gpulease_admitted = False
        self.gpulease_answered_at = None
        admitted = None
        if choice.profile.gpu is not None:
            try:
                admitted = await self._admit(choice)
            finally:
                self._gpulease_admitted = True
            self.gpulease_devices = tuple(admitted.placement.uuids)
        else:
            self._gpulease_admitted = True
            await asyncio.to_thread(ctx.assignments.release, self.user.name, self.name, "restart")
            self.gpulease_devices = ()
        self._options_to_restore = None
        self.gpulease_isolation = None
        self.notebook_dir = str(home)
        self.popen_kwargs = {**self.popen_kwargs, "cwd": str(home)}
        self.log.info(
            "%s placed on %s", self._log_name, ", ".join(self.gpulease_devices) or "no GPU"
        )
        try:
            await self._isolate(choice, home)
            spec = self._spec()
            self.cmd = [*self.gpulease_isolation.cmd_prefix, *spec.cmd]
            try:
                ip, port = await super().start()
            except PermissionError:
                raise web.HTTPError(
                    500, f"Cannot start the server: {self.cmd[0]} cannot be run as "
                    f"{self._spec().env['USER']} (permission denied on its way or its "
                    "interpreter); see docs/security.md") from None
            answered = await self._wait_until_answering(ip, port, self.http_timeout)
            if answered:
                await self._first_answer(choice, admitted)
            elif answered is None:
                # Still starting (a slow config in the home, a slow image):
                # JupyterHub keeps waiting for it after start returns, and so
                # does billing, which must open at its first answer.
                self._watch_first_answer(ip, port, choice, admitted)
            return ip, port
        except BaseException:
            await self._release("server_died")
            await self._remove_cgroup()
            raise

    async def _admit(self, choice: ServerChoice):
        """Limits, then devices now or a place in the queue (gpulease.spawners.queue_runner)."""
        profile = choice.profile
        # Read the hub's ORM here, on the event loop's thread.
        groups = {g.name: {u.name for u in g.users} for g in self.user.groups}
        runner = runner_for(self.gpulease, self.queue_poll_interval)
        try:
            return await runner.admit(
                self.user.name, self.name, profile.slug, profile.gpu.device_request(),
                user_groups=set(groups), group_members=groups,
                max_wait=self.queue_max_wait, max_length=self.queue_max_length,
                max_per_user=self.queue_places_per_user,
            )
        except Refused as refused:
            self.refuse(refused.status, f"Cannot start {profile.slug}: {refused.message}")
        except SQLAlchemyError as e:
            self.log.error("gpulease database error placing %s: %s", self._log_name, e)
            self.refuse(503, DATABASE_DOWN)

    async def _wait_until_answering(self, ip: str, port: int,
                                    timeout: float | None) -> bool | None:
        """True as soon as the server answers HTTP (any status; `gpulease_answered_at`
        says when), False once its process ended or this run is being stopped, None
        after `timeout` seconds without an answer (None: no limit).

        Billing starts at that answer. It also saves time: JupyterHub's own
        readiness check tries once at once, then backs off with growing random
        delays while JupyterLab starts; returning only when the server answers
        lets its first try succeed (about a second per spawn, bench/spawn.py).
        """
        proc = self.proc

        def still_ours() -> bool:  # died (JupyterHub's own check reports it), or stopped
            return not (proc is None or proc.poll() is not None or self.proc is not proc
                        or self._stopping)

        url = f"http://{ip}:{port}{self.server.base_url}api"
        answered = await first_answer(url, still_ours, timeout)
        if isinstance(answered, datetime):
            self.gpulease_answered_at = answered
            return True
        return answered

    async def _first_answer(self, choice: ServerChoice, admitted) -> None:
        """The server answered: bill it from now on, and tell a queued user it started."""
        await self._open_session(choice)
        self._gpulease_unwatch = watch_server_exit(self)  # billed to the very exit
        if admitted is not None and admitted.queued:
            await tell_started(self.gpulease, self.user.name, self.name, choice.profile.slug,
                               admitted.waited_s)

    def _watch_first_answer(self, ip: str, port: int, choice: ServerChoice, admitted) -> None:
        """After start returned unanswered: open the session at the first answer, if any."""
        proc = self.proc
        returned = utcnow()

        async def watch() -> None:
            try:
                if not await self._wait_until_answering(ip, port, None):
                    return  # ended or stopped before it ever answered
                if self._stopping or self.proc is not proc:
                    return
                late = (self.gpulease_answered_at - returned).total_seconds()
                self.log.warning("%s first answered %.1f s after its start returned (a slow "
                                 "start); its billing session opens now", self._log_name, late)
                await self._first_answer(choice, admitted)
            except web.HTTPError:
                pass  # the database is away: the heartbeat opens it from the answer's time
            except Exception:
                self.log.exception("watching for the first answer of %s", self._log_name)

        self._gpulease_watch = asyncio.ensure_future(watch())  # a reference keeps it alive

    async def _open_session(self, choice: ServerChoice) -> None:
        try:  # a suspended notice lasts until the server runs again
            await asyncio.to_thread(self.gpulease.notices.server_started, self.user.name, self.name)
        except SQLAlchemyError as e:
            self.log.warning("could not clear the notices of %s: %s", self._log_name, e)
        meter = self.gpulease.meter
        if meter is None:  # not under `gpulease up` (no metering configured)
            return
        profile = choice.profile
        self._gpulease_opening = True  # not a gap for the heartbeat's repair
        try:
            await asyncio.to_thread(
                meter.open, self.user.name, self.name, profile.slug, choice.account,
                profile.price_per_hour_ucr, self.gpulease_answered_at or utcnow(),
            )
        except SQLAlchemyError as e:
            self.log.error("cannot open the billing session of %s: %s", self._log_name, e)
            raise web.HTTPError(503, DATABASE_DOWN) from None
        finally:
            self._gpulease_opening = False

    async def kill_now(self) -> int:
        """SIGKILL the server and what it started, at once: a stop that did not complete
        (a server that ignores SIGINT and SIGTERM, a stop that hangs). The stop in
        flight then sees the process gone and finishes as any stop does, cgroup and
        devices included; with none in flight, the next poll does. How many it killed."""
        sent = await asyncio.to_thread(kill_tree, self.pid)
        if sent:
            self.log.warning("killed %s (%d processes): its stop did not complete",
                             self._log_name, sent)
        return sent

    async def progress(self):
        choice = self.gpulease_choice
        if choice is None:
            return
        for event in start_events(choice, self.gpulease_balance):
            yield event
        profile = choice.profile
        if profile.gpu is not None:
            runner = runner_for(self.gpulease, self.queue_poll_interval)
            async for event in queue_progress(
                runner, self.user.name, self.name, profile.gpu.device_request().describe(),
                lambda: self._spawn_pending and not self._gpulease_admitted,
            ):
                yield event

    # --- state across hub restarts -------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.gpulease_devices:
            state["gpulease_devices"] = list(self.gpulease_devices)
        if self.gpulease_cgroup:
            state["gpulease_cgroup"] = self.gpulease_cgroup
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpulease_devices = tuple(state.get("gpulease_devices", ()))
        self.gpulease_cgroup = state.get("gpulease_cgroup") or self.gpulease_cgroup

    def clear_state(self):
        super().clear_state()
        self.gpulease_devices = ()
