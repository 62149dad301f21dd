"""Signal (a): a server's processes against the admin's deny list.

The scan (the hub's, around this) reads each process of a server's cgroup or pod:
its pid, its executable's path, the SHA-256 of that executable read through
`/proc/PID/exe` (so a binary renamed, moved or deleted after its start still hashes
to what it is; None where it could not be read), and its command line. This module
matches such records against a `ProcessDenyList` of the admin's entries:

- a hash entry: the executable's SHA-256, hex. A miner's release binary is caught
  under any name it runs as; a rebuilt or packed one is not (the network signals
  and Stratum are for that);
- a pattern entry: a regular expression searched in the command line (the arguments
  joined by single spaces) or in the executable's path. Patterns are compiled once,
  when the list is made; a pattern that does not compile is a ValueError naming its
  entry. Matching ignores case unless the entry says otherwise.

A match is a `Signal` naming the entry by its id only. Each entry also has a
description, for admins; neither it nor the pattern or hash is ever part of a signal,
so nothing derived from a signal can tell a researcher which entry matched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpulease.core.policy.misuse.evidence import (
    PROCESS_HASH,
    PROCESS_PATTERN,
    Signal,
    check_entry_id,
    description_of,
    entries_from_spec,
)

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
TARGETS = ("cmdline", "exe")
# How much of a command line the patterns search: Linux lets one argument be 128 KiB
# and all of them about 2 MiB; 64 KiB bounds a pass's time on a server that pads its
# command line, and holds any real invocation's options whole.
MAX_CMDLINE_CHARS = 65536
# How much of a command line a signal keeps as evidence for admins.
EVIDENCE_CMDLINE_CHARS = 512


@dataclass(frozen=True)
class ProcessRecord:
    """One process of a server, as the scan read it."""

    pid: int
    exe: str | None  # the executable's path (readlink /proc/PID/exe); None: unreadable
    exe_sha256: str | None  # its SHA-256 in hex, read through /proc/PID/exe; None: unreadable
    cmdline: tuple[str, ...] = ()  # /proc/PID/cmdline split at NULs

    @property
    def command_line(self) -> str:
        return " ".join(self.cmdline)


@dataclass(frozen=True)
class ProcessEntry:
    """One entry of the deny list: a hash, or a pattern, with the admin's description."""

    id: str
    sha256: str | None = None  # 64 hex digits (either case; kept in lower case)
    pattern: str | None = None  # a Python regular expression, searched (not anchored)
    target: str = "cmdline"  # what `pattern` is searched in: "cmdline" or "exe"
    ignore_case: bool = True
    description: str = ""  # for admins only: never in a signal, an error or a page of users

    def __post_init__(self) -> None:
        check_entry_id(self.id, "process deny-list entry")
        if (self.sha256 is None) == (self.pattern is None):
            raise ValueError(f"process deny-list entry {self.id!r}: give either sha256 or "
                             "pattern, not both or neither")
        if self.sha256 is not None:
            digest = str(self.sha256).strip().lower()
            if not SHA256_HEX.match(digest):
                raise ValueError(f"process deny-list entry {self.id!r}: sha256 must be 64 "
                                 "hexadecimal digits")
            object.__setattr__(self, "sha256", digest)
        if self.target not in TARGETS:
            raise ValueError(f"process deny-list entry {self.id!r}: target {self.target!r} is "
                             f"not one of {', '.join(TARGETS)}")
        if self.pattern is not None:
            if not isinstance(self.pattern, str) or not self.pattern:
                raise ValueError(f"process deny-list entry {self.id!r}: pattern must be a "
                                 "non-empty regular expression")
            try:
                re.compile(self.pattern, re.IGNORECASE if self.ignore_case else 0)
            except re.error as e:
                raise ValueError(f"process deny-list entry {self.id!r}: pattern "
                                 f"{self.pattern!r} is not a regular expression: {e}") from None


@dataclass(frozen=True)
class ProcessDenyList:
    """The admin's process entries, compiled once."""

    entries: tuple[ProcessEntry, ...] = ()
    max_cmdline_chars: int = MAX_CMDLINE_CHARS
    _by_hash: dict[str, str] = field(init=False, repr=False, compare=False)
    _patterns: tuple[tuple[str, str, re.Pattern[str]], ...] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        entries = tuple(self.entries)
        object.__setattr__(self, "entries", entries)
        ids = [e.id for e in entries]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"process deny list: ids used more than once: {', '.join(twice)}")
        if self.max_cmdline_chars < 1:
            raise ValueError("process deny list: max_cmdline_chars must be at least 1")
        by_hash: dict[str, str] = {}
        for e in entries:
            if e.sha256 is not None:
                by_hash.setdefault(e.sha256, e.id)
        object.__setattr__(self, "_by_hash", by_hash)
        object.__setattr__(self, "_patterns", tuple(
            (e.id, e.target, re.compile(e.pattern, re.IGNORECASE if e.ignore_case else 0))
            for e in entries if e.pattern is not None))

    @classmethod
    def from_spec(cls, items: Iterable[Mapping[str, object]], **options) -> ProcessDenyList:
        """A list from plain values (an admin's file or API body): every problem in one
        ValueError, each naming its entry."""
        known = {"id", "sha256", "pattern", "target", "ignore_case", "description"}
        return cls(entries_from_spec(items, ProcessEntry, known, "process deny-list"),
                   **options)

    def description_of(self, entry_id: str) -> str:
        """An entry's description, for the admins' incident page."""
        return description_of(self.entries, entry_id)


def _detail(record: ProcessRecord, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (("pid", str(record.pid)), ("exe", record.exe or "(unreadable)"),
            ("cmdline", record.command_line[:EVIDENCE_CMDLINE_CHARS]), *extra)


def match_process(record: ProcessRecord, deny: ProcessDenyList, at: float) -> list[Signal]:
    """Every deny-list entry `record` matches, as signals (at most one per entry): its
    hash first, then the patterns in the list's order."""
    found = []
    if record.exe_sha256 is not None:
        entry_id = deny._by_hash.get(record.exe_sha256.lower())
        if entry_id is not None:
            found.append(Signal(PROCESS_HASH, entry_id, at,
                                _detail(record, ("sha256", record.exe_sha256.lower()))))
    if deny._patterns:
        texts = {"cmdline": record.command_line[:deny.max_cmdline_chars],
                 "exe": record.exe or ""}
        for entry_id, target, compiled in deny._patterns:
            if texts[target] and compiled.search(texts[target]):
                found.append(Signal(PROCESS_PATTERN, entry_id, at,
                                    _detail(record, ("matched_in", target))))
    return found


def match_processes(records: Sequence[ProcessRecord], deny: ProcessDenyList,
                    at: float) -> list[Signal]:
    """The signals of all of a server's processes, in the records' order."""
    return [s for record in records for s in match_process(record, deny, at)]
