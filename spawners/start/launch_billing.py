"""Billing from a server's launch, the wait for its first answer, and a failed start.

A mixin of GPULeaseSpawnCore (spawners/spawn_core.py), kept apart so that the
core stays about the spawn path. A researcher's code runs from the server's
launch (their config, .pth files, kernels' startup files), so its billing
session opens there (`_bill_from_launch`: a cold start's return from Popen, a
warm child's report from its cgroup, a container's startedAt), whatever
happens next; the first HTTP answer only marks it ready. A start its own code
failed — it exited before answering, or did not answer within `http_timeout`
and was killed whole (`_kill_unanswered`) — raises StartFailed: its session
closes as start_failed (the spawner's release), it is counted for the
rationing of gpulease.store.failed_starts (`_count_failed_start`), which
`_refuse_if_rationed` applies to the next start (429, Retry-After).

A spawner provides `_run_still_ours`, `_watch_exit`, `_kill_unanswered` and,
if it can say more than "it is no longer running", `_exit_description`.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError
from traitlets import Integer
from traitlets.config import Configurable

from gpulease.core.policy.options import ServerChoice
from gpulease.core.refusal import Refusal
from gpulease.spawners.context import GPULeaseContext
from gpulease.spawners.http_error import http_error
from gpulease.spawners.queueing.base import tell_started
from gpulease.spawners.start.admission import DATABASE_DOWN
from gpulease.spawners.start.first_answer import first_answer
from gpulease.store.failed_starts import (
    DEFAULT_LIMIT,
    DEFAULT_WINDOW_S,
    FailedStarts,
    Rationing,
)


class StartFailed(Exception):
    """The server's own code failed its start: `why` is what the researcher is told;
    `status` what the start answers: 504 it did not answer in time, 502 it exited (the
    server behind the hub failed, not the hub); `tail` the last lines the server wrote,
    as shown (gpulease.core.server_log.shown_tail), once the spawner has read them."""

    def __init__(self, why: str, status: int = 502, tail: str = ""):
        super().__init__(why)
        self.why = why
        self.status = status
        self.tail = tail


TAIL_HEADING = "The last lines your server wrote:"


def failed_start_error(said: str, status: int, tail: str) -> Exception:
    """The error JupyterHub shows for a start the server's own code failed: `said`, then
    the last lines the server wrote, in the API's answer, the spawn's progress
    (JupyterHub's `jupyterhub_message`, and `jupyterhub_html_message` for its pages: the
    text escaped, the lines kept as lines) and its "Spawn failed" page. The tail is the
    researcher's own text, already stripped of control sequences; it is escaped here
    like any text, never marked safe as it is. The error's own text (what JupyterHub
    writes to the hub's log) is `said` alone: no line of a server's reaches that log."""
    error = http_error(Refusal(said, status=status))
    error.jupyterhub_message = (  # type: ignore[attr-defined]
        f"{said}\n\n{TAIL_HEADING}\n{tail}" if tail else said)
    page = f"<p>{html.escape(said)}</p>"
    if tail:
        page += (f"<p>{html.escape(TAIL_HEADING)}</p>"
                 f'<pre class="gpulease-log-tail">{html.escape(tail)}</pre>')
    error.jupyterhub_html_message = page  # type: ignore[attr-defined]
    return error


class LaunchBilling(Configurable):
    """See the module doc. The spawner's own attributes it reads are declared here."""

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

    gpulease_answered_at: datetime | None = None  # this run's first HTTP answer (UTC)
    gpulease_launched_at: datetime | None = None  # this run's launch (UTC): billed from here
    _gpulease_opening: bool = False  # its billing session is being written now
    _gpulease_unwatch = staticmethod(lambda: None)  # stops watching for its exit
    # what the server's launch is, in the words of the progress page
    gpulease_launch_words = "its launch"

    # the spawner's (GPULeaseSpawnCore and JupyterHub's Spawner)
    gpulease: GPULeaseContext
    http_timeout: float
    _stopping: bool
    _spawn_pending: bool
    _log_name: str
    refuse: Callable[[Refusal], None]
    gpulease_choice: ServerChoice | None

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
        own code failed too often (gpulease.store.failed_starts)."""
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
                                       choice.profile.slug, failed.why, None, failed.tail):
                self.log.warning("%s: starts of %s are paused: %d failed within %d s",
                                 self._log_name, choice.profile.slug, self.failed_start_limit,
                                 self.failed_start_window)
        except SQLAlchemyError as e:
            self.log.error("could not count the failed start of %s: %s", self._log_name, e)
        billed = ""
        if billed_ms is not None and choice.rate_per_hour_ucr > 0:
            billed = (f" It was billed for the {billed_ms / 1000:.1f} s it ran "
                      "(end reason start_failed).")
        return failed_start_error(
            f"Your server could not start: {failed.why}.{billed} Look at what runs as it "
            "starts: your ~/.jupyter config, startup files, packages in your home.",
            failed.status, failed.tail)

    async def _count_failed_wait(self) -> None:
        """Count a start whose server answered gpulease's probe but not JupyterHub's own
        check (below 500, within http_timeout): JupyterHub stops it, and says why."""
        choice = self.gpulease_choice
        if choice is not None:
            await self._count_failed_start(choice, StartFailed(
                f"it did not answer JupyterHub's own check (a status below 500) within "
                f"{self.http_timeout:g} s"), await self._billed_ms_of_failed_start())

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
                choice.reservation_id, self._run_started(),
            )
        except SQLAlchemyError as e:
            self.log.error("cannot open the billing session of %s: %s", self._log_name, e)
            raise http_error(Refusal(DATABASE_DOWN, status=503)) from None
        finally:
            self._gpulease_opening = False

    def _run_started(self) -> datetime | None:
        """The hub's start of this run (JupyterHub's `started`, set before `start`), which
        the culler's GPU readings name; naive UTC as the hub keeps it."""
        orm = getattr(self, "orm_spawner", None)
        started = getattr(orm, "started", None)
        if started is None:
            return None
        return started.astimezone(UTC).replace(tzinfo=None) \
            if started.tzinfo is not None else started

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

    def _billed_since_event(self) -> dict | None:
        """"Starting — billed since ..." once the server is launched and still starting."""
        launched = self.gpulease_launched_at
        if not self._spawn_pending or launched is None:
            return None
        return {"progress": 90, "message": f"Starting — billed since {launched:%H:%M:%S} UTC "
                f"(your server's code runs from {self.gpulease_launch_words})"}
