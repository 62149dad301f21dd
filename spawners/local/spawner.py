"""LocalGPUSpawner: one local JupyterLab process per server, on its placed devices.

The decisions are made elsewhere, as plain functions: which profile
(`gpulease.core.policy.options`), which devices (`gpulease.core.capacity.placement`, made
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
import shlex
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from subprocess import Popen

from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.utils import random_port
from traitlets import Bool, Dict, Instance, Integer, Unicode, Union

from gpulease.core.clock import utcnow
from gpulease.core.policy.options import ServerChoice
from gpulease.core.policy.sandbox_net import SERVER_PORT
from gpulease.core.refusal import Refusal
from gpulease.host.netns import NetnsError
from gpulease.host.state import StateDir, StateError, ensure_home
from gpulease.host.unix_accounts import UnixAccountError, UnixAccountPolicy
from gpulease.spawners.http_error import http_error
from gpulease.spawners.local import isolation
from gpulease.spawners.local.cgroups import CgroupError
from gpulease.spawners.local.exit_watch import wait_for_exit, watch_server_exit
from gpulease.spawners.local.process_spec import (
    build_process_spec,
    filter_server_env,
    warm_request,
    why_not_warm,
)
from gpulease.spawners.local.process_tree import kill_tree
from gpulease.spawners.local.run_end import RunEnd
from gpulease.spawners.local.sandbox import Sandbox, enter_spec, pool_for, source_root
from gpulease.spawners.local.server_output import ServerOutput
from gpulease.spawners.local.warm_start import (
    WarmChild,
    WarmLauncher,
    WarmStartError,
    WarmUnavailable,
    check_script,
    launcher_for,
)
from gpulease.spawners.spawn_core import GPULeaseSpawnCore
from gpulease.spawners.start.launch_billing import StartFailed


class LocalGPUSpawner(GPULeaseSpawnCore, RunEnd, ServerOutput, LocalProcessSpawner):
    """Run each server as a local process on the GPU devices placed for it.

    The spawn path shared with the cluster shape (the form, options, refusals,
    progress, the first answer and billing) is GPULeaseSpawnCore's
    (spawners/spawn_core.py); its queue and limit options AdmissionOptions'; where
    its output goes, ServerOutput's (spawners/local/server_output.py).
    """

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
    unix_hub_id = Unicode("", config=True, help="This hub's id, recorded in each Unix account "
                          "it makes; an account recording another is refused. Set by "
                          "`gpulease up` from the state folder's private/hub_id.")
    adopt_unmarked_accounts = Bool(False, config=True, help="Adopt an account that records "
                                   "no hub. Set by `gpulease up` "
                                   "(GPULeaseHub.adopt_unmarked_accounts).")
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

    warm_start = Bool(
        True, config=True,
        help="Fork each server from a launcher that has already imported the server "
        "(spawners/local/warm_start.py): about 1.5 s less to a server's first answer. False: each "
        "server starts as a new program. Set by `gpulease up` from GPULeaseHub.warm_start.",
    )

    sandbox = Dict(
        config=True,
        help="Each server's sandbox: a network namespace on the hub's bridge, its own IPC, "
        "/dev/shm, /tmp and a /proc that hides other accounts' processes (docs/security.md). "
        "Keys: tag, subnet (the bridge's), resolv_conf (the namespaces' resolver file). "
        "Empty: off. Set by `gpulease up` from GPULeaseHub.server_sandbox.",
    )

    proc = Union([Instance(Popen), Instance(WarmChild)], allow_none=True,
                 help="The server's process: a Popen, or a WarmChild of the warm launcher.")

    gpulease_isolation: isolation.Prepared | None = None
    gpulease_cgroup: dict | None = None  # what to remove when the server stops (kept in state)
    gpulease_devices: tuple[str, ...] = ()
    gpulease_sandbox: Sandbox | None = None  # its network namespace (kept in state)

    # --- the process ------------------------------------------------------------

    def make_preexec_fn(self, name):
        # Join the server's cgroup, then become the user's Unix account
        # (spawners/local/isolation.py); neither without per-user accounts and limits.
        prepared = self.gpulease_isolation
        return isolation.preexec_for(prepared, self._sandbox_spec()) if prepared else None

    def _sandbox_spec(self) -> dict | None:
        """What the server's process enters before it becomes the researcher's."""
        sandbox, choice = self.gpulease_sandbox, self.gpulease_choice
        if sandbox is None or choice is None:
            return None
        image = choice.image
        env = (image.local_env if image else None) or self.server_env or sys.prefix
        return enter_spec(
            sandbox, memory_bytes=choice.profile.memory_bytes,
            resolv_conf=self.sandbox.get("resolv_conf", ""),
            needed=[self._state_root(), env, source_root(),
                    *(node for nodes in self.device_nodes.values() for node in nodes)])

    def _pool(self):
        return pool_for(self.sandbox["tag"], self.sandbox["subnet"])

    async def _take_sandbox(self) -> None:
        """A network namespace of its own, made ahead; the server listens there."""
        if not self.sandbox:
            return
        try:
            self.gpulease_sandbox = await asyncio.to_thread(self._pool().take)
        except (NetnsError, OSError) as e:
            self.log.error("cannot give %s a sandbox: %s", self._log_name, e)
            raise http_error(Refusal(f"Cannot start the server: {e}", status=500)) from None
        self.ip = self.gpulease_sandbox.address
        self.port = SERVER_PORT  # its own namespace's: no other server can hold it

    async def _drop_sandbox(self) -> None:
        sandbox, self.gpulease_sandbox = self.gpulease_sandbox, None
        if sandbox is not None and self.sandbox:
            await asyncio.to_thread(self._pool().drop, sandbox)

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
            policy=UnixAccountPolicy(self.unix_prefix, self.unix_uid_min, self.unix_uid_max,
                                     hub_id=self.unix_hub_id,
                                     adopt_unmarked=self.adopt_unmarked_accounts),
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
            raise http_error(Refusal(f"Cannot start the server: {e}", status=500)) from None
        self.gpulease_cgroup = self.gpulease_isolation.state() or None

    def _state_root(self):
        if not self.state_dir:
            raise RuntimeError("LocalGPUSpawner.state_dir is not set")
        return self.state_dir

    async def start(self):
        choice = self.gpulease_choice
        if choice is None:  # apply_user_options always runs first in JupyterHub >= 5.3
            self.refuse(Refusal("No profile was resolved for this start"))
        ctx = self.gpulease
        try:  # a name outside the rule is refused earlier (apply_gpulease_options)
            home = ensure_home(StateDir(Path(self._state_root())), self.user.name)
        except StateError as e:
            self.refuse(Refusal(f"Cannot start the server: {e}", status=500))
        self._gpulease_admitted = False
        self.gpulease_answered_at = None
        self.gpulease_launched_at = None
        self.gpulease_admitted_at = None  # set by _admit (spawners/queueing/pending.py)
        await self._refuse_if_rationed(choice)
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
        self._gpulease_exited_at = None
        try:
            await self._isolate(choice, home)
            await self._take_sandbox()
            spec = self._spec()
            self.cmd = [*self.gpulease_isolation.cmd_prefix, *spec.cmd]
            output = await self._capture_output()  # its own log, never the hub's
            try:
                ip, port, launched_at = await self._launch(spec.cmd[0], output)
            except PermissionError:
                raise http_error(Refusal(
                    f"Cannot start the server: {self.cmd[0]} cannot be run as "
                    f"{self._spec().env['USER']} (permission denied on its way or its "
                    "interpreter); see docs/security.md", status=500)) from None
            finally:
                self._output_launched()
            # From here the researcher's code runs (their config, .pth files, kernels'
            # startup files): billed from the launch, until the last of it has ended.
            self._gpulease_starting = True
            await self._bill_from_launch(choice, launched_at)
            await self._await_first_answer(ip, port, choice, admitted)
            return ip, port
        except StartFailed as failed:
            # Killed (or exited) before it answered: nothing of it runs on after its
            # session closes, at the moment the last of it ended.
            await self._release("start_failed", self._gpulease_exited_at)
            failed.tail = await self._output_tail()  # what it wrote: shown to its owner
            raise await self._count_failed_start(
                choice, failed, await self._billed_ms_of_failed_start()) from None
        except BaseException:
            # Stopped while it started (the researcher's DELETE, a credit stop), cancelled,
            # or gpulease's own error: what was launched is ended now, and billed to then
            # (a stop's reason stands: it was recorded, or its release closes first).
            ended = await self._end_launched_run()
            await self._release("user" if self._stopping else "server_died", ended)
            await self._remove_cgroup()
            raise
        finally:
            self._gpulease_starting = False

    async def _kill_unanswered(self) -> str:
        """SIGKILL the server and its process tree now (its cgroup is emptied by the
        release that follows: what escaped the tree too), and time its exit."""
        proc = self.proc
        sent = await asyncio.to_thread(kill_tree, self.pid)
        if proc is not None:
            exited = await wait_for_exit(proc, 10)
            if exited is not None:
                self._gpulease_exited_at = self._gpulease_exited_at or exited
        return f"{sent} process{'es' if sent != 1 else ''}"

    async def _end_launched_run(self) -> datetime | None:
        """SIGKILL a launched server's process tree (its cgroup follows in the release)
        and return when it ended; None when nothing was launched."""
        proc = self.proc
        if self.gpulease_launched_at is None or proc is None:
            return None
        if proc.poll() is None:
            await asyncio.to_thread(kill_tree, self.pid)
        return self._gpulease_exited_at or await wait_for_exit(proc, 10) or utcnow()

    def _exit_description(self) -> str:
        status = self.proc.poll() if self.proc is not None else None
        if status is None:
            return "it is no longer running"
        return f"signal {-status}" if status < 0 else f"exit status {status}"

    # --- warm starts (spawners/local/warm_start.py, singleuser/warm_launcher.py) ---------------

    async def _launch(self, script: str, output: int) -> tuple[str, int, datetime]:
        """Fork the server from its environment's warm launcher, or start it cold, with
        `output` as its stdout and stderr; where it listens, and the moment its code could
        first run (UTC): a warm child's report from its cgroup, or a cold start's return
        from Popen (after its exec)."""
        interpreter, env_problem = check_script(script)
        why = why_not_warm(enabled=self.warm_start, shell_cmd=self.shell_cmd,
                           cmd_prefix=self.gpulease_isolation.cmd_prefix,
                           interpreter=interpreter, env_problem=env_problem)
        if not why and interpreter:
            launcher, known = launcher_for(interpreter, self.launcher_env)
            if known:
                try:
                    return await self._start_warm(launcher, output)
                except WarmUnavailable as e:
                    why = str(e)
            else:
                why = "its environment's warm launcher is only starting now"
        if self.warm_start:
            self.log.info("%s starts cold: %s", self._log_name, why)
        self.popen_kwargs = {**self.popen_kwargs, **self._cold_output(output)}
        ip, port = await super().start()  # Popen has returned: exec'd, in its cgroup
        return ip, port, utcnow()

    def launcher_env(self) -> dict[str, str]:
        """The launcher's environment: what every server gets from the hub's (env_keep),
        never a secret; HOME nowhere, so that no account's user site is imported."""
        kept = {k: os.environ[k] for k in self.env_keep if k in os.environ}
        state = StateDir(Path(self._state_root()))
        return {**filter_server_env(kept, isolation.SECRET_ENV, isolation.hub_secrets(state)),
                "HOME": "/nonexistent"}

    async def _start_warm(self, launcher: WarmLauncher, output: int
                          ) -> tuple[str, int, datetime]:
        """LocalProcessSpawner.start, with the launcher's fork in place of Popen."""
        if self.port == 0:
            self.port = random_port()
        argv = [*self.cmd, *self.get_args()]
        prepared = self.gpulease_isolation
        account = prepared.account
        request = warm_request(
            argv=argv, env=self.get_env(), cwd=self.popen_kwargs["cwd"],
            uid=account.uid if account else None, gid=account.gid if account else None,
            groups=isolation.own_groups(account) if account else None,
            cgroup_dirs=prepared.plan.dirs if prepared.plan else (),
            sandbox=self._sandbox_spec())
        self.log.info("Spawning %s (forked by warm launcher %d)", shlex.join(argv),
                      launcher.pid)
        # The fork gets a copy of `output` of its own: a start cancelled meanwhile closes
        # the spawner's at once, while the fork may still be sending it.
        forking = asyncio.ensure_future(asyncio.to_thread(_fork, launcher, request,
                                                          os.dup(output)))
        try:
            # Shielded: a start cancelled meanwhile (the researcher's DELETE, a timeout)
            # must not leave a forked server running that no one knows of (Popen
            # cannot be cancelled half way either).
            self.proc = await asyncio.shield(forking)
        except WarmStartError as e:
            raise http_error(Refusal(f"Cannot start the server: {e}", status=500)) from None
        except asyncio.CancelledError:
            forking.add_done_callback(_end_unwanted_child)
            raise
        self.pid = self.proc.pid
        return self.ip or "127.0.0.1", self.port, self.proc.launched_at or utcnow()

    def _run_still_ours(self) -> Callable[[], bool]:
        proc = self.proc

        def still_ours() -> bool:  # died (JupyterHub's own check reports it), or stopped
            return not (proc is None or proc.poll() is not None or self.proc is not proc
                        or self._stopping)
        return still_ours

    def _watch_exit(self) -> Callable[[], None]:
        return watch_server_exit(self)  # billed to the very exit

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

    # --- state across hub restarts -------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.gpulease_devices:
            state["gpulease_devices"] = list(self.gpulease_devices)
        if self.gpulease_cgroup:
            state["gpulease_cgroup"] = self.gpulease_cgroup
        if self.gpulease_sandbox is not None:
            state["gpulease_sandbox"] = self.gpulease_sandbox.state()
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpulease_devices = tuple(state.get("gpulease_devices", ()))
        self.gpulease_cgroup = state.get("gpulease_cgroup") or self.gpulease_cgroup
        if state.get("gpulease_sandbox") and self.sandbox:  # running on, after a restart
            self.gpulease_sandbox = Sandbox.from_state(state["gpulease_sandbox"])
            self._pool().adopt(self.gpulease_sandbox)

    def clear_state(self):
        super().clear_state()
        self.gpulease_devices = ()


def _fork(launcher: WarmLauncher, request: dict, output: int) -> WarmChild:
    """The launcher's fork of a server writing to `output` (closed here once sent)."""
    try:
        return launcher.spawn(request, output)
    finally:
        os.close(output)


def _end_unwanted_child(forking: asyncio.Future) -> None:
    """The server a cancelled warm start forked: killed, as the start was abandoned."""
    if not forking.cancelled() and forking.exception() is None:
        child = forking.result()
        child.kill()
        child.close()


def prestart_warm_launcher(config) -> str:
    """Start the default environment's warm launcher with the hub; the line that says
    whether servers are forked warm, and if not why (shown at the hub's start)."""
    probe = LocalGPUSpawner(config=config)  # the spawner's options as configured
    script = build_process_spec(
        user="", home=Path("/"), device_uuids=(), local_env=probe.server_env or None,
        run_as_uid=0, profile_slug="", image_name="").cmd[0]
    interpreter, env_problem = check_script(script)
    why = why_not_warm(enabled=probe.warm_start, shell_cmd=probe.shell_cmd,
                       cmd_prefix=("systemd-run",) if probe.resource_limits == "systemd" else (),
                       interpreter=interpreter, env_problem=env_problem)
    if why or not interpreter:
        return f"Warm starts: off, {why or 'no interpreter'}: servers start as new programs"
    launcher_for(interpreter, probe.launcher_env)
    return ("Warm starts: on (servers are forked from a launcher that has imported them; "
            "GPULeaseHub.warm_start = False turns this off)")
