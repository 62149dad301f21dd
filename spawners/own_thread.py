"""Run a blocking wait in a thread of its own and await its result on the loop.

For waits that may last seconds (a server's first answer, its process's exit):
asyncio.to_thread would hold a worker of the loop's default executor, which
the hub's database calls share and which a few such waits would fill (it has
min(32, cores + 4) workers). A thread each costs little and ends with its wait.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_own_thread(fn: Callable[[], T], name: str) -> T:
    """`fn()` in a new daemon thread; its result (or exception) here."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def run() -> None:
        try:
            outcome: tuple[bool, object] = (True, fn())
        except BaseException as e:  # noqa: BLE001 - handed to the waiting coroutine
            outcome = (False, e)
        try:
            loop.call_soon_threadsafe(_settle, done, outcome)
        except RuntimeError:  # the loop is closed: the hub is gone, nobody waits
            pass

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done


def _settle(done: asyncio.Future, outcome: tuple[bool, object]) -> None:
    if done.done():  # the waiting coroutine was cancelled
        return
    ok, value = outcome
    if ok:
        done.set_result(value)
    else:
        done.set_exception(value)  # type: ignore[arg-type]
