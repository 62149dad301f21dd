"""What the culler knows about one running server in one pass: plain data, no I/O.

Every reading may be missing. A reader that fails leaves its field None and
says why in the matching `*_error` text, so a decision can list the signal as
'unknown: why' instead of silently treating it as quiet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

DEFAULT_WARN_BEFORE_S = 300


@dataclass(frozen=True)
class KernelState:
    """One kernel as its server pushed it (jupyter_server's kernel model)."""

    id: str
    execution_state: str  # 'busy', 'idle', 'starting', 'dead', ...
    last_activity: datetime | None
    connections: int


@dataclass(frozen=True)
class ServerSnapshot:
    """One server's readings in one pass, with the limits of its profile."""

    user: str
    server: str  # "" for the default server
    profile: str
    started: datetime
    # Real user activity the hub has recorded for this server (see policy.py:
    # in a deployment it must not include background polls of an open tab).
    hub_last_activity: datetime | None
    kernels: tuple[KernelState, ...] | None  # None: could not be read
    terminals_last_activity: datetime | None
    cpu_percent: float | None  # percent of one core; None: unknown
    gpu_percent: float | None  # compute utilisation; None: unknown or no GPU
    gpu_source: str  # 'nvml' | 'gpm' | 'dcgm' | 'none' | why it is unknown
    has_gpu: bool
    idle_timeout_s: int  # 0: never idle-suspended
    max_runtime_s: int  # 0: unlimited
    warn_before_s: int
    kernels_error: str = ""
    terminals_error: str = ""  # non-empty: terminals could not be read
    cpu_error: str = ""
    kernels_source: str = ""  # how the kernels are known, for the log: "pushed 12s ago"
    # The last activity of any kernel, those shut down since too (as the server pushed it).
    kernels_last_activity: datetime | None = None
    # The server pushes no kernel state (no gpulease.singleuser): the hub's
    # activity stands in for its kernels and terminals and may confirm idleness.
    hub_activity_only: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.user, self.server)

    @property
    def label(self) -> str:
        return f"{self.user}/{self.server or '(default)'}"


def default_warn_before(timeout_s: int, configured_s: int = DEFAULT_WARN_BEFORE_S) -> int:
    """The notice lead time: the configured one (5 min), at most half the timeout.

    Half, so that a short timeout (seconds, in tests) still leaves the user a
    quiet first half before any notice appears.
    """
    if timeout_s <= 0:
        return 0
    return min(configured_s, timeout_s // 2)
