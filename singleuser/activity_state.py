"""This server's kernels and terminals, in the shape it pushes to the gpulease service.

    {"kernels": [{"id", "execution_state", "last_activity", "connections"}...],
     "terminals": [{"name", "last_activity"}...] | null,
     "last_kernel_activity": ISO time | null}

`terminals` is null when the server has no terminal support.
`last_kernel_activity` is the kernel manager's own record of the last activity on
any kernel, including kernels shut down since: a short kernel (a script started
through the REST API that runs a cell and shuts its kernel down) can come and go
between two looks, and would otherwise leave no trace for the culler. Reading is
in-process (the kernel manager's and terminal manager's own memory): no
request, so looking every second costs next to nothing. What changes the
culler's view at once (a kernel started, stopped, turned busy or idle, a
client attached, a terminal opened or closed) is `state_key`; the kernels'
and terminals' last activity, which moves with every output message, is
`activity_key`.
"""

from __future__ import annotations

from typing import Any

from jupyter_server._tz import isoformat
from jupyter_server.utils import ensure_async

KERNEL_KEYS = ("id", "execution_state", "last_activity", "connections")


async def collect(serverapp: Any) -> dict[str, Any]:
    kernel_manager = serverapp.kernel_manager
    kernels = await ensure_async(kernel_manager.list_kernels())
    any_kernel = getattr(kernel_manager, "last_kernel_activity", None)
    terminals_manager = serverapp.web_app.settings.get("terminal_manager")
    terminals = None
    if terminals_manager is not None:
        terminals = [{"name": t.get("name"), "last_activity": t.get("last_activity")}
                     for t in terminals_manager.list()]
    return {"kernels": [{k: model.get(k) for k in KERNEL_KEYS} for model in kernels],
            "terminals": terminals,
            "last_kernel_activity": isoformat(any_kernel) if any_kernel else None}


def state_key(body: dict[str, Any]) -> tuple:
    kernels = sorted((k["id"], k["execution_state"], k["connections"]) for k in body["kernels"])
    terminals = None if body["terminals"] is None else sorted(
        str(t["name"]) for t in body["terminals"])
    return (tuple(kernels), None if terminals is None else tuple(terminals))


def activity_key(body: dict[str, Any]) -> tuple:
    times = [str(k["last_activity"]) for k in body["kernels"]]
    times += [str(t["last_activity"]) for t in body["terminals"] or ()]
    return (*sorted(times), str(body.get("last_kernel_activity")))
