"""Driver compatibility: an image's CUDA needs an NVIDIA driver at least this new.

A notebook image's catalog entry names `min_driver`, the oldest driver its CUDA
version runs on. A GPU whose driver is older (NVML's version on the embedded
box; GPU feature discovery's labels in the cluster) is never given to a server
of that image: the placement functions (gpulease/core/capacity/placement.py,
gpulease/core/capacity/queue.py,
gpulease/core/capacity/cluster_inventory.py) pass over it, and when no GPU of the request's
kind has a new enough driver the start is refused 422 naming the image, the
driver it needs and the newest driver there is. A GPU that declares no driver
(an inventory file without `driver`, a node without the labels) is not checked.
Pure functions; no NVML, no Kubernetes client.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

log = logging.getLogger("gpulease.drivers")
FULL_LABEL = "nvidia.com/cuda.driver-version.full"
PART_LABELS = tuple(f"nvidia.com/cuda.driver-version.{p}" for p in ("major", "minor", "revision"))
_VERSION = re.compile(r"\d+(\.\d+)*")
_unchecked: set[tuple[str, str]] = set()  # (where, min_driver) already logged


def driver_version(text: str | None) -> tuple[int, ...] | None:
    """"570.124.06" -> (570, 124, 6); None for no version or not one. Trailing zero
    parts do not count ("570.124" is "570.124.0")."""
    text = (text or "").strip()
    if not _VERSION.fullmatch(text):
        return None
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def driver_from_labels(labels: Mapping[str, str]) -> str:
    """A node's driver as GPU feature discovery labels it: the `.full` label, else
    major.minor.revision (a revision may be empty or zero-padded); "" if neither."""
    full = labels.get(FULL_LABEL, "").strip()
    if driver_version(full) is not None:
        return full
    major, minor, revision = (labels.get(k, "").strip() for k in PART_LABELS)
    if not (major.isdigit() and minor.isdigit()):
        return ""
    parts = [str(int(major)), str(int(minor))] + ([str(int(revision))] if revision.isdigit()
                                                  else [])
    return ".".join(parts)


def new_enough(driver: str | None, min_driver: str | None, where: str = "") -> bool:
    """True unless both are known and `driver` is older than `min_driver`. A GPU that
    declares no driver is not checked (logged once per place and need)."""
    need = driver_version(min_driver)
    if need is None:
        return True
    have = driver_version(driver)
    if have is None:
        if where and (where, str(min_driver)) not in _unchecked:
            _unchecked.add((where, str(min_driver)))
            log.info("%s declares no NVIDIA driver: an image's need for %s or newer is not "
                     "checked there", where, min_driver)
        return True
    return have >= need


def newest(drivers: Iterable[str | None]) -> str:
    """The newest known driver of these ("none known" if none)."""
    known = [(v, d) for d in drivers if (v := driver_version(d)) is not None]
    return max(known)[1] if known else "none known"


def too_old(image: str | None, min_driver: str, what: str, drivers: Iterable[str | None]) -> str:
    """The 422 when no GPU of `what` has a new enough driver."""
    return (f"The image {image or '(unnamed)'} needs NVIDIA driver {min_driver} or newer, "
            f"and no {what} here has it (the newest driver on one is "
            f"{newest(drivers)}), so it can never be placed.")
