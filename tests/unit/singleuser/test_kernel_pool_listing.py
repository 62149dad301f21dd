"""PooledKernelManager.list_kernels while a kernel is being registered.

jupyter-client puts a started kernel in the manager's table one loop turn before
jupyter-server gives it `last_activity` and `execution_state`. JupyterLab polls
api/kernels while the pooled kernel starts with the server; a listing in that
turn answered 500 (seen in CI on a resumed server). No kernel process is needed
to show it: the table entry is what the listing reads.
"""

from __future__ import annotations

from types import SimpleNamespace

from jupyter_server._tz import utcnow

from gpulease.singleuser.kernel_pool import PooledKernelManager


def manager_with(**kernels) -> PooledKernelManager:
    km = PooledKernelManager(pool_kernel=False)
    km._kernels.update(kernels)
    for kernel_id in kernels:
        km._kernel_connections[kernel_id] = 0
    return km


def test_a_kernel_not_yet_fully_registered_is_left_out_not_an_error():
    ready = SimpleNamespace(kernel_name="python3", last_activity=utcnow(),
                            execution_state="idle")
    half = SimpleNamespace(kernel_name="python3")  # no last_activity nor execution_state yet
    km = manager_with(ready=ready, half=half)
    assert [k["id"] for k in km.list_kernels()] == ["ready"]


def test_a_real_kernel_manager_without_its_last_activity_is_left_out():
    """What CI saw: jupyter-server's ServerKernelManager whose last_activity trait is not
    set yet raises TraitError (not AttributeError) when read; api/kernels answered 500."""
    from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

    half = ServerKernelManager(kernel_name="python3")
    ready = SimpleNamespace(kernel_name="python3", last_activity=utcnow(),
                            execution_state="idle")
    km = manager_with(ready=ready, half=half)
    assert [k["id"] for k in km.list_kernels()] == ["ready"]


def test_the_pooled_kernel_is_not_listed_even_half_registered():
    km = manager_with(pooled=SimpleNamespace(kernel_name="python3"))
    km._pooled = "pooled"
    assert km.list_kernels() == []
