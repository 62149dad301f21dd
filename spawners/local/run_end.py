"""The end of a local server's run: its stop, its death, and what both release.

A mixin of LocalGPUSpawner, before JupyterHub's LocalProcessSpawner: a stop
(JupyterHub's or gpulease's) or a death found by a poll ends everything the
server started, closes its billing session at the moment the last of it
ended, and gives its devices back once its cgroup is empty (or out of
service while it cannot be emptied).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from gpulease.core.clock import utcnow
from gpulease.spawners.context import GPULeaseContext
from gpulease.spawners.local import isolation
from gpulease.spawners.local.cgroup_kill import Emptied, devices_may_go
from gpulease.spawners.local.exit_watch import wait_for_exit
from gpulease.spawners.local.process_tree import end_processes_at, kill_tree, process_tree
from gpulease.spawners.queueing.runner import runner_for


class RunEnd:
    """stop, wait_for_death, poll and the release they share (see the module doc)."""

    # LocalGPUSpawner's, declared (and defaulted) there:
    gpulease: GPULeaseContext
    gpulease_devices: tuple[str, ...]
    gpulease_cgroup: dict | None
    _stopping: bool
    _gpulease_admitted: bool
    _gpulease_unwatch: Callable[[], None]
    _end_billing: Callable[[str, datetime | None], Awaitable[None]]
    _count_failed_wait: Callable[[], Awaitable[None]]  # LaunchBilling's
    _drop_sandbox: Callable[[], Awaitable[None]]  # its network namespace's name

    _gpulease_exited_at: datetime | None = None  # when a stop saw its process end (UTC)
    # launched, not answered yet: the start itself ends (and bills) a run that dies now
    _gpulease_starting: bool = False
    _gpulease_releasing: asyncio.Lock | None = None  # held while a release runs

    async def stop(self, now=False):
        # LocalProcessSpawner.stop polls while it waits for the process to end:
        # that exit is this stop's doing, not a death, and so is the end of what
        # the server left running; a poll or the exit watch meanwhile must not
        # close the session as server_died (at the last heartbeat) or release.
        self._stopping = True
        self._gpulease_unwatch()  # this stop times the exit itself (wait_for_death)
        self._gpulease_exited_at = None
        leftovers = await asyncio.to_thread(process_tree, self.pid)  # all of /proc: off the loop
        # JupyterHub stops a server it waited for in vain (its own check had no answer
        # below 500 within http_timeout, though gpulease's probe had one): the server's
        # own doing, a failed start. Killed at once, not given SIGINT's and SIGTERM's
        # waits (a minute more on the device), closed as start_failed and counted.
        failed_wait = bool(getattr(self, "_waiting_for_response", False))
        if failed_wait:
            await asyncio.to_thread(kill_tree, self.pid)
        try:
            await super().stop(now=now)
        finally:
            try:
                self._gpulease_admitted = False  # the next start is admitted afresh
                # What the user started (a background training run, a terminal's
                # jobs) must not outlive the server and keep using a GPU that is
                # handed to someone else next; if any was left, billing runs until
                # it was ended.
                ended = await asyncio.to_thread(end_processes_at, leftovers)
                # A stop through JupyterHub's own API or pages counts as the user's;
                # gpulease's api/stop records its reason on the session beforehand.
                # _release first ends what escaped the process tree (double fork,
                # setsid, a respawn loop) through the cgroup.
                self.log.info("%s stopped: its process ended at %s%s", self._log_name,
                              self._gpulease_exited_at,
                              f"; what it left running was ended at {ended}" if ended else "")
                try:
                    await self._release("start_failed" if failed_wait else "user",
                                        ended or self._gpulease_exited_at)
                except Exception:
                    # JupyterHub drops a stop's error without a word (stop_single_user)
                    self.log.exception("%s: its stop could not release all it held",
                                       self._log_name)
                    raise
                if failed_wait:
                    await self._count_failed_wait()
            finally:
                self._stopping = False

    async def wait_for_death(self, timeout=10):
        """Whether the process ended within `timeout` s, seen as it ends: a thread
        waits on it, where JupyterHub polls at backed-off, random intervals (0.1,
        0.3, 0.7, 1.5 s ...), and the session of a stopped server was billed on
        until one of them noticed. The exit's time is kept for the session's end."""
        if self.proc is None:  # after a hub restart only the pid is known: JupyterHub's polls
            return await super().wait_for_death(timeout)
        exited = await wait_for_exit(self.proc, timeout)
        if exited is None:
            return False
        self._gpulease_exited_at = exited
        return await self.poll() is not None

    async def poll(self):
        # LocalProcessSpawner.poll clears the state (and so our devices) when
        # the process is gone: look before it does.
        held = self.gpulease_devices
        status = await super().poll()
        meter = self.gpulease.meter
        if status is None:
            if meter is not None:
                meter.mark_alive(self.user.name, self.name)
        elif self._stopping or self._gpulease_starting:
            pass  # the stop, or the start that fails now, ends it
        elif held or (meter is not None and (self.user.name, self.name) in meter.live):
            await self._release("server_died")
        if status is not None and not self._stopping and not self._gpulease_starting:
            await self._remove_cgroup()  # died: JupyterHub does not call stop()
        return status

    async def _remove_cgroup(self) -> tuple[Emptied | None, datetime | None]:
        """End everything in the server's cgroup and remove it (None: it had none);
        and when that was done, if it had anything to end. Its sandbox's namespace goes
        with it (the kernel frees it once the last of its processes is gone)."""
        cgroup, self.gpulease_cgroup = self.gpulease_cgroup, None
        if not cgroup:
            await self._drop_sandbox_logged()
            return None, None

        def end() -> tuple[Emptied, datetime]:
            return isolation.end_everything(cgroup), utcnow()

        emptied, at = await asyncio.to_thread(end)
        await self._drop_sandbox_logged()
        if not emptied.empty:
            self.log.error("%s stopped, but its cgroup is not empty: %s", self._log_name,
                           emptied.describe())
        return emptied, (at if emptied.found else None)

    async def _drop_sandbox_logged(self) -> None:
        """Drop the sandbox's namespace name; a failure is logged, never the stop's: the
        name is the host's bookkeeping, and the stop still has a session to close and
        devices to give back (a name whose file cannot be removed, its mount shadowed by a
        later bind of /run/netns onto itself, is gpulease.spawners.local.sandbox's case)."""
        try:
            await self._drop_sandbox()
        except Exception:
            self.log.exception("%s: cannot drop its sandbox's network namespace",
                               self._log_name)

    async def _release(self, reason: str, ended: datetime | None = None) -> None:
        """Release the devices and close the billing session, with the stop's reason.

        The session ends when the last of the server ended: at `ended` (its
        exit, or its leftovers' end) or, if its cgroup still held processes,
        when they were ended; with neither known, now. The devices go back to
        the pool only once the server's cgroup is empty; when it cannot be
        emptied they are out of service until it is
        (gpulease.spawners.local.quarantine, checked on every heartbeat).

        One at a time: a stop that comes while a poll releases its dead server
        finds the cgroup taken and would give the devices back while the poll
        is still emptying it (and before it could take them out of service).
        """
        if self._gpulease_releasing is None:
            self._gpulease_releasing = asyncio.Lock()
        async with self._gpulease_releasing:
            await self._release_now(reason, ended)

    async def _release_now(self, reason: str, ended: datetime | None) -> None:
        self._gpulease_unwatch()
        emptied_at: datetime | None = None
        try:
            emptied, emptied_at = await self._remove_cgroup()
        finally:
            # Whatever ending the cgroup came to, the session closes now, with this
            # release's reason: JupyterHub drops a failed stop's error and counts the
            # server gone, and the heartbeat would close it later as server_died.
            ended = max((t for t in (ended, emptied_at) if t is not None), default=None)
            self.gpulease_devices = ()
            await self._end_billing(reason, ended)  # GPULeaseSpawnCore's
        ctx = self.gpulease
        user, server = self.user.name, self.name
        if devices_may_go(emptied):
            def give_back() -> object:
                return ctx.assignments.release(user, server, reason)
        else:
            def give_back() -> object:
                return ctx.assignments.take_out_of_service(user, server, reason, emptied.state(),
                                                           emptied.describe())
        try:
            await asyncio.to_thread(give_back)
            runner_for(ctx, self.queue_poll_interval).released()  # a queued spawn may fit now
        except SQLAlchemyError as e:
            # The server is stopped all the same; its devices are released as
            # soon as the database answers again (and at the latest at restart).
            self.log.error("cannot release the devices of %s yet: %s", self._log_name, e)
            if ctx.meter is not None:
                ctx.meter.deferred.append(give_back)
