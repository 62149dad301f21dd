"""The decision: one server's misuse signals combined into one action.

Each kind of signal (`evidence.KINDS`) has an action in the `MisusePolicy`, and an
entry of the admin's lists may have its own (`by_entry`, by id). The decision takes
the strongest action of its signals, in the order

    none < warn < suspend < lock

where suspend stops the server with the end reason `abuse` (its home kept, nothing
billed after the stop) and lock also refuses the account's further starts until an
admin clears it. Two rules hold whatever the policy says:

- the GPU signal (c) never does more than warn: a researcher's own training run,
  started from a cell before they left, looks the same; so a server is only ever
  stopped on a process (a) or network (b) signal;
- an account stopped for abuse `lock_after_stops` times (this stop included; the
  caller counts the earlier ones from its incidents) is locked.

A decision keeps the signals it used (those whose action was not none), strongest
first, each with its evidence and the id of the entry that matched; its
`researcher_message` names none of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpulease.core.policy.misuse.evidence import GPU_RULE_ID, GPU_UNATTENDED, KINDS, Signal

NONE, WARN, SUSPEND, LOCK = "none", "warn", "suspend", "lock"
ACTIONS = (NONE, WARN, SUSPEND, LOCK)  # weakest first
_RANK = {a: n for n, a in enumerate(ACTIONS)}
# The end reason a stop for misuse closes its session with (the sessions' END_REASONS
# take it when the hub's layer lands).
ABUSE_END_REASON = "abuse"

# What the researcher is shown: never which entry, signal, pattern or address matched,
# so that the deny list cannot be learnt by trying.
RESEARCHER_MESSAGE = {
    NONE: "",
    WARN: "",
    SUSPEND: "This server was stopped: it ran software this service does not allow "
             "(such as cryptocurrency mining). Your files are kept. If you think this is "
             "a mistake, write to the service's admins.",
    LOCK: "This server was stopped and your account may not start servers: it ran "
          "software this service does not allow (such as cryptocurrency mining). Your "
          "files are kept. An admin can clear your account; write to the service's admins.",
}


def _check_action(name: str, action: object) -> None:
    if action not in ACTIONS:
        raise ValueError(f"misuse policy {name}: {action!r} is not one of {', '.join(ACTIONS)}")


@dataclass(frozen=True)
class MisusePolicy:
    """The action for each kind of signal, and when an account is locked."""

    # A binary on the deny list is a miner's release build under whatever name: stop.
    # Not lock at once: a researcher may have run a downloaded tool without knowing.
    process_hash: str = SUSPEND
    # A command line an admin's pattern matches (`stratum+tcp://`, a miner's options).
    process_pattern: str = SUSPEND
    # A connection to a listed pool address: no research talks to a mining pool.
    network_address: str = SUSPEND
    # A listed port alone: miners' usual ports are also other software's (Selenium Grid
    # 4444, Flower 5555): a warning for admins to look.
    network_port: str = WARN
    # The Stratum handshake itself: the server is mining, by its own words. Lock.
    stratum: str = LOCK
    # The GPU at full with nobody using the server: at most a warning, always.
    gpu_unattended: str = WARN
    # The n-th abuse stop of an account locks it (this one counted); 0: never by count.
    lock_after_stops: int = 2
    # Actions for single entries of the admin's lists, by id: they replace their kind's.
    by_entry: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind in KINDS:
            _check_action(kind, getattr(self, kind))
        for entry_id, action in self.by_entry.items():
            _check_action(f"by_entry[{entry_id!r}]", action)
        if _RANK[self.gpu_unattended] > _RANK[WARN] or \
                _RANK[self.by_entry.get(GPU_RULE_ID, NONE)] > _RANK[WARN]:
            raise ValueError("misuse policy gpu_unattended: the GPU signal may only warn "
                             "(none or warn): a researcher's unattended job looks the same, "
                             "so a stop needs a process or network signal")
        if self.lock_after_stops < 0:
            raise ValueError("misuse policy lock_after_stops must be 0 (never) or more")

    def action_for(self, signal: Signal) -> str:
        action = self.by_entry.get(signal.rule_id, getattr(self, signal.kind))
        if signal.kind == GPU_UNATTENDED and _RANK[action] > _RANK[WARN]:
            return WARN
        return action


@dataclass(frozen=True)
class Decision:
    """What to do about one server, and why."""

    action: str  # one of ACTIONS
    user: str
    server: str  # the server's name ("" for the default server)
    at: float
    signals: tuple[Signal, ...] = ()  # the signals it used, strongest first
    prior_abuse_stops: int = 0

    @property
    def stops(self) -> bool:
        return self.action in (SUSPEND, LOCK)

    @property
    def locks(self) -> bool:
        return self.action == LOCK

    @property
    def end_reason(self) -> str | None:
        return ABUSE_END_REASON if self.stops else None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of signal it used, in KINDS' order."""
        used = {s.kind for s in self.signals}
        return tuple(k for k in KINDS if k in used)

    @property
    def researcher_message(self) -> str:
        return RESEARCHER_MESSAGE[self.action]

    def evidence(self) -> dict[str, object]:
        """The incident's record, for admins (audit log, incidents page, API, mail):
        what matched, when, on which server; deny-list entries by id."""
        return {"action": self.action, "user": self.user, "server": self.server,
                "at": self.at, "end_reason": self.end_reason, "kinds": list(self.kinds),
                "signals": [{"kind": s.kind, "source": s.source, "rule_id": s.rule_id,
                             "at": s.at, "detail": s.detail_dict()} for s in self.signals]}


def decide(user: str, server: str, signals: Sequence[Signal], now: float,
           policy: MisusePolicy = MisusePolicy(), prior_abuse_stops: int = 0) -> Decision:
    """The action for one server's signals of one scan (or one alert)."""
    acted = [(policy.action_for(s), s) for s in signals]
    used = [(a, s) for a, s in acted if a != NONE]
    action = max((a for a, _ in used), key=_RANK.__getitem__, default=NONE)
    if action == SUSPEND and policy.lock_after_stops \
            and prior_abuse_stops + 1 >= policy.lock_after_stops:
        action = LOCK
    used.sort(key=lambda pair: (-_RANK[pair[0]], pair[1].at))
    return Decision(action, user, server, now, tuple(s for _, s in used), prior_abuse_stops)
