"""GPULeaseSpawnCore: what every gpulease spawner does, whatever runs the server.

A mixin placed before the JupyterHub spawner it extends (LocalProcessSpawner
for LocalGPUSpawner; KubeSpawner for the cluster shape). It holds the part
of the spawn path that is the same in both shapes:

- the start form, a start's options and their restore when it is refused
  (`apply_user_options` is gpulease.spawners.admission's: profile, rights,
  credit, CPU-only totals);
- one way to refuse a start (`refuse`, a gpulease.hub.refusal.Refusal);
- the progress a waiting user sees (the choice, the balance, the queue);
- billing from the server's launch (`_bill_from_launch`: the moment its code
  can first run on the devices), the wait for its first answer (which marks it
  ready and no longer opens billing), and a start its own code failed: it
  exited before answering, or did not answer within `http_timeout` and was
  killed (`StartFailed`, end reason `start_failed`, counted for the rationing
  of gpulease.hub.failed_starts, which `_refuse_if_rationed` applies);
- the notices that go with a start.

A subclass adds what differs: where the server runs and how it is admitted
to capacity (`start`), whether this run is still the one being started
(`_run_still_ours`), how its end is watched (`_watch_exit`) and how a start
that does not answer is killed (`_kill_unanswered`). The core imports the
model and billing core and no spawner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import object_session
from traitlets import Integer, Unicode, default

from gpulease.hub.context import GPULeaseContext, get_context
from gpulease.hub.failed_starts import (
    DEFAULT_LIMIT,
    DEFAULT_WINDOW_S,
    FailedStarts,
    Rationing,
)
from gpulease.hub.options import SPOT, ServerChoice, withdrawn_after_waiting
from gpulease.hub.refusal import Refusal, http_error
from gpulease.spawners.admission import DATABASE_DOWN, apply_gpulease_options, start_events
from gpulease.spawners.admission_options import AdmissionOptions
from gpulease.spawners.first_answer import first_answer
from gpulease.spawners.hub_log import join_hub_log
from gpulease.spawners.options_form import (
    options_from_form,
    refuse_query_start,
    render_options_form,
)
from gpulease.spawners.pending_spawns import register, register_collector
from gpulease.spawners.queue_base import QueueBase, Refused, queue_progress, tell_started
from gpulease.spawners.queue_runner import runner_for
from gpulease.spawners.spawn_form import AvailabilityOf, spawn_form_data


class StartFailed(Exception):
    """The server's own code failed its start: `why` is what the researcher is told;
    `status` what the start answers: 504 it did not answer in time, 502 it exited (the
    server behind the hub failed, not the hub)."""

    def __init__(self, why: str, status: int = 502):
        super().__init__(why)
        self.why = why
        self.status = status


class GPULeaseSpawnCore(AdmissionOptions):
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
    failed_start_limit = Integer(
        DEFAULT_LIMIT, config=True,
        help="Failed starts (the server exited before it answered, or did not answer within "
        "http_timeout) of one user on one profile within failed_start_window after which "
        "further starts of that profile are refused (429) until the oldest leaves the "
        "window; 0: never. Set by `gpulease up` from GPULeaseHub.failed_start_limit.",
    )
    failed_start_window = Integer(
        DEFAULT_WINDOW_S, config=True,
        help="Seconds over which failed starts are counted for failed_start_limit. Set by "
        "`gpulease up` from GPULeaseHub.failed_start_window.",
    )

    gpulease_choice: ServerChoice | None = None
    gpulease_balance: int = 0  # the account's balance when this start was admitted
    _options_to_restore: tuple[dict | None] | None = None
    _stopping: bool = False
    _gpulease_admitted: bool = False  # this start is past the limits and the queue
    gpulease_answered_at: datetime | None = None  # this run's first HTTP answer (UTC)
    gpulease_launched_at: datetime | None = None  # this run's launch (UTC): billed from here
    gpulease_admitted_at: float | None = None  # monotonic; this start's admission
    _gpulease_opening: bool = False  # its billing session is being written now
    _gpulease_unwatch = staticmethod(lambda: None)  # stops watching for its exit

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
        # Read the hub's ORM here, on the loop; spawn_form gathers the rest from
        # gpulease's database in a thread, so a busy database stalls only this page.
        groups = {g.name for g in spawner.user.groups}
        orm_spawner = spawner.orm_spawner
        saved = dict(orm_spawner.user_options or {}) if orm_spawner else {}
        availability = await spawner._form_availability()
        data = await asyncio.to_thread(spawn_form_data, spawner.gpulease, spawner.user.name,
                                       groups, saved, availability)
        return render_options_form(data)

    async def _form_availability(self) -> AvailabilityOf | None:
        """What the start form shows free per GPU request; None: this host's devices
        (the embedded shape). The cluster shape's spawner answers from the cluster."""
        return None

    def options_from_form(self, formdata):
        return options_from_form(formdata)

    def options_from_query(self, query_data):
        return refuse_query_start(query_data)  # a link starts nothing (spawners/options_form.py)

    def refuse(self, refusal: Refusal):
        """Fail this start with `refusal`, restoring the saved options it replaced.

        JupyterHub 6.1 saves a start's `user_options` before any spawner code
        runs (gpulease.spawners.admission remembers what they were)."""
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
                max_per_user=self.queue_places_per_user, spot=choice.tier == SPOT,
                reservation=choice.reservation_id,
            )
            if admitted.queued:  # the queue may have been long: is the profile still theirs?
                await self._still_usable_after_waiting(choice)
            self.gpulease_admitted_at = time.monotonic()  # pending from here (pending_spawns)
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

    # --- what a subclass provides -------------------------------------------------

    def _run_still_ours(self) -> Callable[[], bool]:
        """A check, made now, of whether the run being started is still this start's:
        False once it ended, was replaced or is being stopped."""
        raise NotImplementedError

    def _watch_exit(self) -> Callable[[], None]:
        """Start watching for the end of the run that answered; returns what stops it.
        Without a watch the heartbeat's polls see the end."""
        return lambda: None

    # --- billing from the launch, and the first answer ---------------------------------

    async def _wait_until_answering(self, ip: str, port: int, timeout: float | None,
                                    still_ours: Callable[[], bool] | None = None
                                    ) -> bool | None:
        """True as soon as the server answers HTTP (any status; `gpulease_answered_at`
        says when), False once its run ended or is being stopped, None after
        `timeout` seconds without an answer (None: no limit).

        Returning only when the server answers saves time: JupyterHub's own
        readiness check tries once at once, then backs off with growing random
        delays while JupyterLab starts; this lets its first try succeed (about a
        second per spawn, bench/spawn.py).
        """
        url = f"http://{ip}:{port}{self.server.base_url}api"
        answered = await first_answer(url, still_ours or self._run_still_ours(), timeout)
        if isinstance(answered, datetime):
            self.gpulease_answered_at = answered
            return True
        return answered

    def _failed_starts(self) -> FailedStarts:
        return FailedStarts(self.gpulease.engine,
                            Rationing(self.failed_start_limit, self.failed_start_window))

    async def _refuse_if_rationed(self, choice: ServerChoice) -> None:
        """Refuse (429, Retry-After) a start of a profile whose recent starts this user's
        own code failed too often (gpulease.hub.failed_starts)."""
        try:
            refusal = await asyncio.to_thread(self._failed_starts().refusal, self.user.name,
                                              choice.profile.slug)
        except SQLAlchemyError as e:
            self.log.error("gpulease database error checking the failed starts of %s: %s",
                           self._log_name, e)
            self.refuse(Refusal(DATABASE_DOWN, status=503))
        if refusal is not None:
            self.refuse(refusal)

    async def _bill_from_launch(self, choice: ServerChoice, launched_at: datetime) -> None:
        """The server's code can run on its devices from `launched_at` (UTC): its billing
        session opens there, whatever happens next (its first answer only marks it
        ready), and its exit is watched from now on."""
        self.gpulease_launched_at = launched_at
        self.log.info("%s launched at %s UTC: billed from then", self._log_name,
                      f"{launched_at:%H:%M:%S.%f}"[:-3])
        await self._open_session(choice, launched_at)
        self._gpulease_unwatch = self._watch_exit()  # billed to the very end

    async def _await_first_answer(self, ip: str, port: int, choice: ServerChoice,
                                  admitted) -> None:
        """Wait up to `http_timeout` for the launched server's first answer. Answered:
        tell a queued user it started. Not answered in time: killed at once, whole
        (`_kill_unanswered`), and StartFailed; exited first: StartFailed too. A stop
        meanwhile fails the start as JupyterHub's own check would."""
        answered = await self._wait_until_answering(ip, port, self.http_timeout)
        if answered:
            if admitted is not None and admitted.queued:
                await tell_started(self.gpulease, self.user.name, self.name,
                                   choice.profile.slug, admitted.waited_s)
            return
        if answered is None:
            killed = await self._kill_unanswered()
            raise StartFailed(f"it did not answer within {self.http_timeout:g} s of its "
                              f"launch and was killed ({killed})", status=504)
        if self._stopping:
            raise http_error(Refusal("The server was stopped before it was ready", status=409))
        raise StartFailed(f"it exited before it answered ({self._exit_description()})")

    async def _kill_unanswered(self) -> str:
        """Kill the whole server at once, no grace (what it started included); a few
        words on what was killed."""
        raise NotImplementedError

    def _exit_description(self) -> str:
        """How the server's process ended ("exit status 1"), for the start's failure."""
        return "it is no longer running"

    async def _billed_ms_of_failed_start(self) -> int | None:
        """What the failed start's closed session was billed (None: not metered, or its
        close is still waiting for the database)."""
        meter = self.gpulease.meter
        if meter is None or self.gpulease_launched_at is None:
            return None
        try:
            latest = await asyncio.to_thread(meter.sessions.latest_by_server, self.user.name)
        except SQLAlchemyError:
            return None
        session = latest.get(self.name)
        return session.billed_ms() if session is not None and session.ended else None

    async def _count_failed_start(self, choice: ServerChoice, failed: StartFailed,
                                  billed_ms: int | None) -> Exception:
        """A start the server's own code failed: counted for the rationing and logged;
        returns the error JupyterHub shows the researcher. Its session is closed as
        start_failed by the subclass, billed `billed_ms` (None: not billed)."""
        self.log.warning("%s: start failed: %s", self._log_name, failed.why)
        try:
            if await asyncio.to_thread(self._failed_starts().record, self.user.name, self.name,
                                       choice.profile.slug, failed.why):
                self.log.warning("%s: starts of %s are paused: %d failed within %d s",
                                 self._log_name, choice.profile.slug, self.failed_start_limit,
                                 self.failed_start_window)
        except SQLAlchemyError as e:
            self.log.error("could not count the failed start of %s: %s", self._log_name, e)
        billed = ""
        if billed_ms is not None and choice.rate_per_hour_ucr > 0:
            billed = (f" It was billed for the {billed_ms / 1000:.1f} s it ran "
                      "(end reason start_failed).")
        return http_error(Refusal(
            f"Your server could not start: {failed.why}.{billed} Look at what runs as it "
            "starts: your ~/.jupyter config, startup files, packages in your home.",
            status=failed.status))

    async def _open_session(self, choice: ServerChoice, started: datetime) -> None:
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
                choice.rate_per_hour_ucr, started, choice.tier,
                choice.reservation_id,
            )
        except SQLAlchemyError as e:
            self.log.error("cannot open the billing session of %s: %s", self._log_name, e)
            raise http_error(Refusal(DATABASE_DOWN, status=503)) from None
        finally:
            self._gpulease_opening = False

    async def _end_billing(self, reason: str, ended: datetime | None) -> None:
        """Close the billing session with `reason`: at `ended`, the last moment the
        server was known to run (its exit, or what it left running ended), else now."""
        meter = self.gpulease.meter
        if meter is None:
            return
        if ended is not None:
            # A death closes at the last moment it was seen alive; what it left
            # running was alive until it was ended.
            meter.mark_alive(self.user.name, self.name, ended)
        await asyncio.to_thread(meter.close, self.user.name, self.name, reason, ended)

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

    # what the server's launch is, in the words of the progress page
    gpulease_launch_words = "its launch"

    def _billed_since_event(self) -> dict | None:
        """"Starting — billed since ..." once the server is launched and still starting."""
        launched = self.gpulease_launched_at
        if not self._spawn_pending or launched is None:
            return None
        return {"progress": 90, "message": f"Starting — billed since {launched:%H:%M:%S} UTC "
                f"(your server's code runs from {self.gpulease_launch_words})"}
