"""gpulease's own log lines in the hub's log, with its timestamps and level.

gpulease's modules log to `gpulease.*` loggers (the cluster watch's failures, the
queue's admissions). In a hub process nothing configures those: Python's
last-resort handler printed their warnings bare, without a time, and dropped the
info lines, so a hang could not be placed in the log. They are given the hub's
own handlers and level, once, where the process has no logging set up of its own
(a root logger without handlers: a test run's capture has some, and is left be).
"""

from __future__ import annotations

import logging

GPULEASE_LOGGER = "gpulease"


def join_hub_log(hub_log: logging.Logger, root: logging.Logger | None = None) -> None:
    """`root`: the process's root logger (tests pass one of their own)."""
    ours = logging.getLogger(GPULEASE_LOGGER)
    root = root if root is not None else logging.getLogger()
    if ours.handlers or root.handlers or not hub_log.handlers:
        return
    for handler in hub_log.handlers:
        ours.addHandler(handler)
    ours.setLevel(hub_log.getEffectiveLevel())
    ours.propagate = False
