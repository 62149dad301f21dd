"""A kernel started with the server, handed to the first request for one: a pool of one.

A kernel takes ~0.4 s to start (ipykernel's own imports); started only when
the researcher opens a notebook, the first cell waits for it. This kernel
manager starts one kernel of the default kernel spec in the server's root
folder as the server starts (the extension's load calls `fill_pool`),
and gives it to the first request that would have started exactly that
kernel: no explicit kernel id, the default kernel spec, the root folder, the
server's own environment (a notebook session adds only JPY_SESSION_NAME,
which the kernel is then given before the request is answered, as ipykernel
would have read it at start: `os.environ` and `__session__`). Any other
request starts a kernel as jupyter-server always does, and shuts the pooled
kernel down: the first kernel asked for was another, the pool's moment is
past. The pool is not refilled; a pooled kernel nobody asks for is shut down
after `pool_unclaimed_timeout`.

Until it is handed out, the kernel is not listed (api/kernels, the state the
server pushes for the idle culler): the researcher sees no kernel they did
not ask for. It runs in the server's process tree, account and cgroup, like
any kernel. `PooledKernelManager.pool_kernel = False` turns it off.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import subprocess
import uuid
from typing import Any

from jupyter_server._tz import utcnow
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web
from traitlets import Bool, Float, TraitError


class PooledKernelManager(AsyncMappingKernelManager):
    pool_kernel = Bool(
        True, config=True,
        help="Start one kernel of the default kernel spec in the root folder as the server "
        "starts, and give it to the first request for that kernel there.",
    )
    pool_unclaimed_timeout = Float(
        600.0, config=True,
        help="Seconds after which a pooled kernel nobody asked for is shut down (it is not "
        "listed, so the researcher could not stop it, and it may run their startup files).",
    )
    pool_ready_timeout = Float(
        60.0, config=True,
        help="Seconds a notebook session waits for the pooled kernel to answer before it is "
        "given a new kernel instead.",
    )

    _pooled: str | None = None  # the kernel waiting to be handed out
    _pool_start: asyncio.Task | None = None
    _releasing: asyncio.Future | None = None
    _pool_env: dict[str, str] | None = None

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._unclaimed: set[str] = set()  # pooled kernels whose messages are not activity

    def fill_pool(self) -> None:
        """Start the pooled kernel. Called as the extension loads, before the server's
        loop runs: the kernel's process is launched at once (~50 ms) and starts while the
        server loads its other extensions and answers the hub; on a running loop (a
        server embedded in another program), as a task."""
        if not self.pool_kernel or self._pooled is not None or self._pool_start is not None:
            return
        kernel_id = str(uuid.uuid4())
        self._pooled = kernel_id  # hidden, and claimable, from this very moment
        self._unclaimed.add(kernel_id)
        self._pool_env = dict(os.environ)  # what the pooled kernel starts with
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = asyncio.get_event_loop_policy().get_event_loop()  # the one tornado runs
            self._pool_start = loop.create_task(self._start_pooled(kernel_id))
            loop.run_until_complete(self._pool_start)
        else:
            self._pool_start = asyncio.ensure_future(self._start_pooled(kernel_id))
        loop.call_later(self.pool_unclaimed_timeout, self._release, "nobody asked for it")
        atexit.register(self._kill_unclaimed, kernel_id)

    async def _start_pooled(self, kernel_id: str) -> None:
        try:
            await super().start_kernel(kernel_id=kernel_id, path="")
        except Exception:  # noqa: BLE001 - the first notebook starts its own, as without a pool
            self.log.exception("gpulease: the pooled kernel did not start")
            if self._pooled == kernel_id:
                self._pooled = None

    def _kill_unclaimed(self, kernel_id: str) -> None:
        """At the server's exit, the pooled kernel if nobody had it: no one's to outlive
        the server. (A server stopped by SIGINT without a terminal ends its loop without
        shutting its kernels down; what it leaves is ended by the hub, and billed until
        then: never for a kernel the researcher did not ask for.)"""
        if kernel_id not in self._unclaimed:
            return  # handed out: the researcher's kernel, ended as theirs are
        process = getattr(getattr(self._kernels.get(kernel_id), "provisioner", None),
                          "process", None)
        if process is None or process.poll() is not None:
            return
        try:  # jupyter-client starts each kernel in a session of its own
            if os.getpgid(process.pid) == process.pid:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
            process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def start_watching_activity(self, kernel_id: str) -> None:
        """As jupyter-server watches every kernel, except that the pooled kernel's
        messages do not move the server's last activity until it is handed out: its
        start, or what a startup file of the researcher's prints, is no one's use."""
        if kernel_id not in self._unclaimed:
            return super().start_watching_activity(kernel_id)
        kernel = self._kernels[kernel_id]
        connect = kernel.connect_iopub

        def connect_quietly(*args: Any, **kwargs: Any) -> Any:
            stream = connect(*args, **kwargs)
            on_recv = stream.on_recv

            def on_recv_quietly(callback: Any, copy: bool = True) -> None:
                def record(msg_list: Any) -> None:
                    before = self.last_kernel_activity
                    callback(msg_list)
                    if kernel_id in self._unclaimed:
                        self.last_kernel_activity = before
                on_recv(record, copy)
            stream.on_recv = on_recv_quietly
            return stream

        kernel.connect_iopub = connect_quietly
        try:
            super().start_watching_activity(kernel_id)
        finally:
            del kernel.connect_iopub  # the class's own again

    def list_kernels(self) -> list[dict]:
        """As jupyter-server lists kernels, less the pooled one, and less a kernel still
        being registered: jupyter-client adds it to the table one loop turn before
        jupyter-server gives it `last_activity` and `execution_state`, and a listing in
        that turn (JupyterLab polls api/kernels while the pooled kernel starts with the
        server, or a notebook's kernel starts) raised TraitError, answered 500."""
        kernels = []
        for kernel_id in self.pinned_superclass.list_kernel_ids(self):
            if kernel_id == self._pooled:
                continue
            try:
                kernels.append(self.kernel_model(kernel_id))
            except (web.HTTPError, KeyError, AttributeError, TraitError):
                # gone, or not yet fully there (ServerKernelManager's last_activity trait
                # unset raises TraitError): listed on the next poll
                pass
        return kernels

    async def start_kernel(self, *, kernel_id: str | None = None, path: str | None = None,
                           **kwargs: Any) -> str:
        claimed = await self._claim(kernel_id, path, kwargs)
        if claimed is not None:
            return claimed
        self._release("the first kernel asked for is another")
        return await super().start_kernel(kernel_id=kernel_id, path=path, **kwargs)

    def _release(self, why: str) -> None:
        """Shut the pooled kernel down: its moment (the first kernel asked for) is past."""
        pooled, self._pooled = self._pooled, None
        if pooled is None:
            return
        self.log.info("gpulease: shutting down the kernel started with the server: %s", why)
        task = asyncio.ensure_future(self._shutdown_pooled(pooled))
        self._releasing = task  # the loop holds tasks only weakly

    async def _shutdown_pooled(self, kernel_id: str) -> None:
        if self._pool_start is not None:
            await self._pool_start
        if kernel_id in self:
            await self.shutdown_kernel(kernel_id, now=True)
        self._unclaimed.discard(kernel_id)

    async def _claim(self, kernel_id: str | None, path: str | None,
                     kwargs: dict[str, Any]) -> str | None:
        """The pooled kernel, made the requested one; None when it is not that kernel."""
        pooled = self._pooled
        env = kwargs.get("env")
        if pooled is None or kernel_id is not None or set(kwargs) - {"kernel_name", "env"}:
            return None
        if kwargs.get("kernel_name") not in (None, "", self.default_kernel_name):
            return None
        if self.cwd_for_path(path or "") != self.cwd_for_path(""):
            return None
        session_name = (env or {}).get("JPY_SESSION_NAME")
        if env and {k: v for k, v in env.items() if k != "JPY_SESSION_NAME"} != self._pool_env:
            return None
        self._pooled = None  # one request gets it, even while the next line waits
        if self._pool_start is not None:
            await self._pool_start
        if pooled not in self:
            return None
        kernel = self.get_kernel(pooled)
        if not await kernel.is_alive() or (
                session_name is not None and not await self._name_session(kernel, session_name)):
            self.log.warning("gpulease: the pooled kernel %s is not usable; starting another",
                             pooled)
            await self.shutdown_kernel(pooled, now=True)
            self._unclaimed.discard(pooled)
            return None
        self._unclaimed.discard(pooled)
        kernel.last_activity = self.last_kernel_activity = utcnow()  # it is being used now
        self.log.info("Kernel started: %s (started with the server)", pooled)
        return pooled

    async def _name_session(self, kernel: Any, session_name: str) -> bool:
        """Give the kernel the notebook's JPY_SESSION_NAME, as if it had started with it."""
        value = repr(session_name)  # a Python literal (JSON's \ud83d pairs are not one)
        code = (f"__import__('os').environ['JPY_SESSION_NAME'] = {value}\n"
                f"get_ipython().user_ns['__session__'] = {value}\n")
        client = kernel.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=self.pool_ready_timeout)
            msg_id = client.execute(code, silent=True, store_history=False)
            while True:
                reply = await client.get_shell_msg(timeout=self.pool_ready_timeout)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return reply["content"].get("status") == "ok"
        except Exception as e:  # noqa: BLE001 - a timeout, a kernel gone: not usable
            self.log.warning("gpulease: cannot name the pooled kernel's session: %s", e)
            return False
        finally:
            client.stop_channels()
