"""Login rate limiting: pure bookkeeping, the clock passed in by the caller.

Failures are counted under three keys, each with its own window and lockout:

- a name from one address (`PAIR`): the one guessing a password is locked
  out of that name, from that address;
- one address, any names (`ADDRESS`): one address guessing many names is
  locked out of every name;
- one name, any address (`USER`): many addresses guessing one name slow it
  down, but never lock its owner out from an address the name has logged in
  from (known, for `KNOWN_S`): tries from there wait `delay_s` (at most a
  second). Tries from other addresses take turns: one password check per
  `delay_s`, doubling with each lockout of the name like a lockout does (60
  checks per lockout with the defaults), and a try whose turn is more than
  `MAX_TURN_WAIT_S` away is refused unchecked. Many addresses at once thus
  guess a name no faster than one would, however many there are.

IPv6 addresses count by their /64, the block one subscriber gets: each of its
2^64 addresses would otherwise be a fresh address.

A try admitted by `check` is in flight until `failure`, `success` or `abandon`
says how it ended, and counts as a failure to be meanwhile: a password check
takes a while, and 100 tries sent at once from one address all passed the
check before the first failure was recorded (91 were checked, with 5
allowed). A try that could be the one locking its name or address waits
(`Verdict.wait`: ask again shortly) until the tries ahead of it have ended.

Refusals are held `delay_s` too before they are answered.

`max_failures` failures of a key inside `window_s` lock that key for
`lockout_s`, doubling with each further lockout of the key up to
`max_lockout_s`. While a `PAIR` or `ADDRESS` key is locked even the right
password is refused from there; while a `USER` key is, its tries are delayed.
A key is forgotten, doubling included, once quiet for max(window_s,
max_lockout_s) past its last failure and its lockout's end (which also bounds
memory): a lockout of max_lockout_s does not reset the doubling itself. A
success clears the name's key for that address, not the name's own: the owner
logging in says nothing about the others guessing it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

USER = "user"
ADDRESS = "address"
PAIR = "user@address"

MAX_DELAY_S = 1.0
MAX_TURN_WAIT_S = 10.0
KNOWN_S = 30 * 24 * 3600.0

Key = tuple[str, ...]


@dataclass(frozen=True)
class Verdict:
    """What to do with a login before its password is checked: wait `delay_s`, then
    refuse it (locked out for `refuse_s` more seconds) or check the password."""

    refuse_s: float = 0.0
    delay_s: float = 0.0
    busy: bool = False  # refused for want of a turn (the name is guessed from elsewhere)
    wait: bool = False  # tries ahead of it could lock it: ask again once they have ended

    @property
    def refused(self) -> bool:
        return self.refuse_s > 0


@dataclass(frozen=True)
class Recorded:
    """What a failure started: a lockout of the name from that address or of the address,
    and/or a slowdown of the name from everywhere else (seconds; 0 when none)."""

    lockout_s: float = 0.0
    slowdown_s: float = 0.0


@dataclass
class _KeyState:
    failures: list[float] = field(default_factory=list)  # times inside the window
    locked_until: float = float("-inf")
    lockouts: int = 0  # lockouts so far, for the doubling
    last: float = float("-inf")  # time of the last failure
    next_turn: float = float("-inf")  # USER keys: when the next check from elsewhere may run
    in_flight: int = 0  # tries admitted and not yet ended


def counted_address(address: str) -> str:
    """The key an address counts under: an IPv6 address's /64, others as they are."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return address


class LoginThrottle:
    def __init__(
        self,
        max_failures: int = 5,
        window_s: float = 600,
        lockout_s: float = 60,
        max_lockout_s: float = 3600,
        delay_s: float = MAX_DELAY_S,
        max_keys: int = 100_000,
    ) -> None:
        if max_failures < 1:
            raise ValueError("max_failures must be at least 1")
        if window_s <= 0 or lockout_s <= 0 or max_lockout_s < lockout_s:
            raise ValueError("need window_s > 0 and 0 < lockout_s <= max_lockout_s")
        if not 0 <= delay_s <= MAX_DELAY_S:
            raise ValueError(f"delay_s must be between 0 and {MAX_DELAY_S} seconds")
        self.max_failures = max_failures
        self.window_s = window_s
        self.lockout_s = lockout_s
        self.max_lockout_s = max_lockout_s
        self.delay_s = delay_s
        self.max_keys = max_keys
        self._states: dict[Key, _KeyState] = {}
        self._known: dict[tuple[str, str], float] = {}  # (name, address): last success
        self._last_prune = float("-inf")

    @staticmethod
    def _keys(user: str, address: str) -> list[Key]:
        # An empty name is not tracked under a name (the address still counts).
        keys: list[Key] = [(ADDRESS, address)]
        if user:
            keys += [(PAIR, user, address), (USER, user)]
        return keys

    def _locked_for(self, key: Key, now: float) -> float:
        state = self._states.get(key)
        return 0.0 if state is None else max(0.0, state.locked_until - now)

    def check(self, user: str, address: str, now: float, known: bool = False) -> Verdict:
        """Whether `user` may try from `address` now, and after what delay (which may
        take the name's next turn: call it once per try). `known`: the client showed
        that it logged in as `user` before (a signed cookie), wherever it is now."""
        address = counted_address(address)
        refuse = self._locked_for((ADDRESS, address), now)
        if user:
            refuse = max(refuse, self._locked_for((PAIR, user, address), now))
        if refuse > 0:
            # Held before the answer: a refusal costs the hub little, and a
            # client sending the next try at once could otherwise make the
            # hub answer refusals as fast as it can.
            return Verdict(refuse_s=refuse, delay_s=self.delay_s)
        keys = self._keys(user, address)
        if any(self._at_limit(key, now) for key in keys if key[0] != USER):
            return Verdict(wait=True)
        verdict = Verdict()
        user_key = (USER, user)
        if user and (self._locked_for(user_key, now) > 0 or self._at_limit(user_key, now)):
            if known or now - self._known.get((user, address), float("-inf")) < KNOWN_S:
                verdict = Verdict(delay_s=self.delay_s)
            else:
                verdict = self._take_turn(self._states[user_key], now)
                if verdict.refused:
                    return verdict
        self._maybe_prune(now, room=len(keys))
        for key in keys:
            self._states.setdefault(key, _KeyState()).in_flight += 1
        return verdict

    def _at_limit(self, key: Key, now: float) -> bool:
        # Failures so far and tries in flight: one more could reach max_failures.
        state = self._states.get(key)
        if state is None or not state.in_flight:
            return False
        recent = sum(1 for t in state.failures if now - t < self.window_s)
        return recent + state.in_flight >= self.max_failures

    def _end(self, user: str, address: str) -> list[Key]:
        keys = self._keys(user, address)
        for key in keys:
            state = self._states.get(key)
            if state is not None and state.in_flight:
                state.in_flight -= 1
        return keys

    def abandon(self, user: str, address: str) -> None:
        """A try `check` admitted ended without a verdict on its password."""
        self._end(user, counted_address(address))

    def _take_turn(self, state: _KeyState, now: float) -> Verdict:
        # Serialised per name, not per try: concurrent tries from many
        # addresses would otherwise each wait delay_s in parallel.
        start = max(now + self.delay_s, state.next_turn)
        if start - now > max(MAX_TURN_WAIT_S, self.delay_s):
            return Verdict(refuse_s=start - now, delay_s=self.delay_s, busy=True)
        doubling = min(2 ** max(0, state.lockouts - 1), self.max_lockout_s / self.lockout_s)
        state.next_turn = start + self.delay_s * doubling
        return Verdict(delay_s=start - now)

    def failure(self, user: str, address: str, now: float) -> Recorded:
        """Record a failed attempt; return what it started."""
        keys = self._end(user, counted_address(address))
        self._maybe_prune(now, room=len(keys))
        lockout = slowdown = 0.0
        for key in keys:
            state = self._states.setdefault(key, _KeyState())
            if now < state.locked_until:
                # Attempts while locked are not counted: a user retrying
                # during a lockout should not extend it.
                continue
            state.last = now
            state.failures = [t for t in state.failures if now - t < self.window_s]
            state.failures.append(now)
            if len(state.failures) >= self.max_failures:
                duration = min(self.lockout_s * 2**state.lockouts, self.max_lockout_s)
                state.locked_until = now + duration
                state.lockouts += 1
                state.failures.clear()
                if key[0] == USER:
                    slowdown = duration
                else:
                    lockout = max(lockout, duration)
        return Recorded(lockout_s=lockout, slowdown_s=slowdown)

    def success(self, user: str, address: str, now: float) -> None:
        """A successful login clears the name's key for that address and makes the address
        known for the name; the address may be shared, and the name guessed elsewhere,
        so their keys stay."""
        address = counted_address(address)
        self._end(user, address)
        if user:
            self._states.pop((PAIR, user, address), None)
            self._known.pop((user, address), None)  # re-inserted last: oldest first
            self._known[(user, address)] = now
            if len(self._known) > self.max_keys:
                del self._known[next(iter(self._known))]

    def _stale(self, state: _KeyState, now: float) -> bool:
        if state.in_flight:
            return False
        quiet_since = max(state.last, state.locked_until, state.next_turn)
        return now - quiet_since >= max(self.window_s, self.max_lockout_s)

    def _maybe_prune(self, now: float, room: int) -> None:
        # Scanning every key on every failure would be O(n) per login; once per
        # window, or when the table is full, keeps it amortised.
        full = len(self._states) + room > self.max_keys
        if not full and now - self._last_prune < self.window_s:
            return
        self.prune(now, room)

    def prune(self, now: float, room: int = 0) -> None:
        """Forget stale keys; if `room` more would still not fit in `max_keys`,
        drop unlocked keys, oldest first."""
        self._last_prune = now
        self._states = {k: s for k, s in self._states.items() if not self._stale(s, now)}
        self._known = {k: t for k, t in self._known.items() if now - t < KNOWN_S}
        if len(self._states) + room <= self.max_keys:
            return
        # Down to 90% so that a full table is not sorted again on every failure.
        excess = len(self._states) + room - int(self.max_keys * 0.9)
        # Locked keys go last, so that flooding the table with new names or
        # addresses cannot be used to lift a lockout.
        states = self._states

        def kept_longest(key: Key) -> tuple[bool, float]:
            state = states[key]
            return now < state.locked_until or state.in_flight > 0, state.last

        order = sorted(states, key=kept_longest)
        for key in order[:excess]:
            del self._states[key]

    def __len__(self) -> int:
        return len(self._states)
