"""Where a local server's stdout and stderr go: a log of its own, never the hub's.

A mixin of LocalGPUSpawner. Each start captures the server's output
(gpulease.host.server_logs.capture: a pipe whose write end becomes the server's
fd 1 and 2, read by a log writer of the hub's account that outlives the hub,
as the server does); a cold start passes the write end to Popen, a warm start
sends it to the launcher with the request (spawners/local/warm_start.py), and
the forked child puts it on its fd 1 and 2 before anything of the
researcher's runs (singleuser/warm_child.py). The hub lets go of its own copy
once the server has it, so that the writer ends when the server's last process
does. A start the server's own code failed reads the end of that output
(`_output_tail`), once the writer has written it, for its owner to see. A server
deleted (a named one removed, its user deleted) takes its logs with it
(`delete_forever`), and one renamed takes them to its new name (`rename`): else
names created (or renamed), started and deleted without end would fill the disk
with the hub's files.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from jupyterhub.utils import maybe_future
from traitlets import Integer, TraitError, validate
from traitlets.config import Configurable

from gpulease.core.refusal import Refusal
from gpulease.core.server_log import DEFAULT_KEEP, DEFAULT_MAX_BYTES, Rotation, rotation_problem
from gpulease.host.server_logs import (
    Capture,
    ServerLogError,
    capture,
    remove_logs,
    rename_logs,
)
from gpulease.spawners.http_error import http_error

WRITTEN_WAIT_S = 3.0  # a failed start waits this long for its output to be written


class ServerOutput(Configurable):
    server_log_max_bytes = Integer(
        DEFAULT_MAX_BYTES, config=True,
        help="Bytes a server's log file grows to before it is rotated (renamed .1, a new one "
        "begun). Set by `gpulease up` from GPULeaseHub.server_log_max_bytes.",
    )
    server_log_keep = Integer(
        DEFAULT_KEEP, config=True,
        help="Rotated log files kept per server (older ones are removed); each start begins "
        "a new file. Set by `gpulease up` from GPULeaseHub.server_log_keep.",
    )

    @validate("server_log_max_bytes", "server_log_keep")
    def _valid_rotation(self, proposal):
        values = {"server_log_max_bytes": self.server_log_max_bytes,
                  "server_log_keep": self.server_log_keep,
                  proposal["trait"].name: proposal["value"]}
        problem = rotation_problem(values["server_log_max_bytes"], values["server_log_keep"])
        if problem:
            raise TraitError(problem)
        return proposal["value"]

    gpulease_output: Capture | None = None  # this start's capture

    # the spawner's (LocalGPUSpawner's and JupyterHub's)
    _log_name: str
    name: str

    def _state_root(self) -> str:
        raise NotImplementedError

    async def _capture_output(self) -> int:
        """A new capture for this start; the descriptor that is to be the server's fd 1 and 2.
        A start whose output cannot be kept apart from the hub's fails (500), naming why."""
        rule = Rotation(self.server_log_max_bytes, self.server_log_keep)
        try:
            self.gpulease_output = await asyncio.to_thread(
                capture, Path(self._state_root()), self.user.name, self.name, rule)
        except (ServerLogError, OSError) as e:
            self.log.error("cannot capture the output of %s: %s", self._log_name, e)
            raise http_error(Refusal(f"Cannot start the server: its log cannot be made ({e})",
                                     status=500)) from None
        return self.gpulease_output.write_fd

    def _cold_output(self, write_fd: int) -> dict:
        """Popen's stdio for a cold start: nothing to read, the capture to write to."""
        return {"stdin": subprocess.DEVNULL, "stdout": write_fd, "stderr": write_fd}

    def _output_launched(self) -> None:
        """The server has its output (or never will): the hub's copy is closed, and the
        next Popen of this spawner gets no stale descriptor."""
        self.popen_kwargs = {k: v for k, v in self.popen_kwargs.items()
                             if k not in ("stdin", "stdout", "stderr")}
        if self.gpulease_output is not None:
            self.gpulease_output.launched()

    async def _output_tail(self) -> str:
        """The end of this start's output as shown, once written (what is left running of
        it may hold the pipe: then what came within WRITTEN_WAIT_S)."""
        output = self.gpulease_output
        if output is None:
            return ""
        output.launched()
        await asyncio.to_thread(output.wait_written, WRITTEN_WAIT_S)
        return await asyncio.to_thread(output.tail)

    async def delete_forever(self) -> None:
        """JupyterHub's hook as a server is deleted (stopped before): its logs removed."""
        try:
            removed = await asyncio.to_thread(remove_logs, Path(self._state_root()),
                                              self.user.name, self.name)
        except (ValueError, OSError) as e:
            self.log.warning("the logs of %s are kept: %s", self._log_name, e)
        else:
            if removed:
                self.log.info("%s deleted: its %d log file(s) removed", self._log_name, removed)
        parent = getattr(super(), "delete_forever", None)
        if parent is not None:
            await maybe_future(parent())

    async def rename(self, old_name: str, new_name: str) -> None:
        """JupyterHub's hook as a stopped server is renamed: its logs take the new name
        (an error refuses the rename, so no log is left under a name no server has)."""
        try:
            await asyncio.to_thread(rename_logs, Path(self._state_root()), self.user.name,
                                    old_name, new_name)
        except (ValueError, OSError) as e:
            raise http_error(Refusal(f"Cannot rename {self._log_name}: its logs cannot be "
                                     f"moved ({e})", status=500)) from None
        parent = getattr(super(), "rename", None)
        if parent is not None:
            await maybe_future(parent(old_name, new_name))
