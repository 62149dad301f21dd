"""Values of gpulease's hub page templates that come from its database, computed off the loop.

JupyterHub builds every page's template variables on its event loop, and a
query there would stall every request of the hub while the database is slow
or busy. So a template variable that needs the database is a call in the
template (`{{ gpulease_banner() }}`) returning an `OffLoop`: JupyterHub renders
pages with Jinja's async mode, which awaits what a call returns, and awaiting
an `OffLoop` runs its computation in a worker thread. JupyterHub's error
pages render synchronously and cannot wait: there it stands for `fallback`,
what is known without the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class OffLoop(Generic[T]):
    """`compute()` in a thread when awaited; `fallback` where it is used without waiting."""

    def __init__(self, compute: Callable[[], T], fallback: T):
        self.compute = compute
        self.fallback = fallback

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.to_thread(self.compute).__await__()

    def __bool__(self) -> bool:
        return bool(self.fallback)

    def __str__(self) -> str:
        return "" if self.fallback is None else str(self.fallback)
