"""What a misuse rule found: a `Signal`, the kinds of signal, and the deny lists' ids.

A signal is evidence for admins: which kind of rule matched, the id of the deny-list
entry that did (never its pattern or description), when, and what of the server it
saw (a process's pid, executable and command line; a connection's address and port;
the GPU's readings). The server it is about is the decision's (`decision.Decision`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

# The kinds of signal, by the letters: (a) processes, (b) network, (c) GPU.
PROCESS_HASH = "process_hash"  # (a) an executable whose SHA-256 is on the deny list
PROCESS_PATTERN = "process_pattern"  # (a) a command line or executable path a pattern matches
NETWORK_ADDRESS = "network_address"  # (b) a connection to a listed address or network
NETWORK_PORT = "network_port"  # (b) a connection to a listed port, any address
STRATUM = "stratum"  # (b) the plain Stratum V1 handshake in a connection's first bytes
GPU_UNATTENDED = "gpu_unattended"  # (c) the GPU at full while no client used the server

KINDS = (PROCESS_HASH, PROCESS_PATTERN, NETWORK_ADDRESS, NETWORK_PORT, STRATUM,
         GPU_UNATTENDED)
SOURCE = {PROCESS_HASH: "a", PROCESS_PATTERN: "a", NETWORK_ADDRESS: "b", NETWORK_PORT: "b",
          STRATUM: "b", GPU_UNATTENDED: "c"}

# A deny-list entry's id: what incidents, the admin page and the audit log name it by.
ENTRY_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# The id a Stratum signal carries: a built-in rule, not an admin's entry.
STRATUM_RULE_ID = "stratum-v1"
GPU_RULE_ID = "gpu-unattended"


class _Entry(Protocol):
    id: str
    description: str


E = TypeVar("E", bound=_Entry)


def entries_from_spec(items: Iterable[Any], make: Callable[..., E], known: set[str],
                      what: str) -> tuple[E, ...]:
    """A deny list's entries from plain values (an admin's file or API body): every
    problem in one ValueError, each naming its entry (`what`: "process deny-list")."""
    entries, problems = [], []
    for n, item in enumerate(items):
        if not isinstance(item, Mapping):
            problems.append(f"{what} entry #{n + 1}: must be a mapping")
            continue
        name = item.get("id", f"#{n + 1}")
        unknown = sorted(set(item) - known)
        if unknown:
            problems.append(f"{what} entry {name!r}: unknown keys {', '.join(unknown)} "
                            f"(allowed: {', '.join(sorted(known))})")
            continue
        try:
            entries.append(make(**item))
        except (TypeError, ValueError) as e:
            problems.append(str(e))
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(entries)


def description_of(entries: Iterable[_Entry], entry_id: str) -> str:
    """An entry's description, for the admins' incident page (KeyError: no such id)."""
    for e in entries:
        if e.id == entry_id:
            return e.description
    raise KeyError(entry_id)


def check_entry_id(entry_id: object, what: str) -> str:
    """`entry_id` if it is a valid id, else a ValueError naming the entry."""
    if not isinstance(entry_id, str) or not ENTRY_ID.match(entry_id):
        raise ValueError(f"{what} id {entry_id!r}: use 1-64 of a-z, 0-9, '.', '_', '-', "
                         "starting with a letter or digit")
    return entry_id


@dataclass(frozen=True)
class Signal:
    """One rule's finding about one server."""

    kind: str  # one of KINDS
    rule_id: str  # the deny-list entry's id, or STRATUM_RULE_ID / GPU_RULE_ID
    at: float  # when it was seen (the scan's time; a connection's own time where known)
    # What was seen, for admins: ("pid", "4242"), ("exe", "/home/ada/xmrig"), ...
    # Values are the server's own data, never the deny list's pattern or description.
    detail: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"signal kind {self.kind!r} is not one of {', '.join(KINDS)}")

    @property
    def source(self) -> str:
        """The issue's letter: 'a' processes, 'b' network, 'c' GPU."""
        return SOURCE[self.kind]

    def detail_dict(self) -> dict[str, str]:
        return dict(self.detail)
