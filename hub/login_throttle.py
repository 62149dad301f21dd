"""Login rate limiting: pure bookkeeping, the clock passed in by the caller.

Failures are counted separately per user name (one account guessed from many
addresses) and per client address (many accounts guessed from one address).
`max_failures` failures of a key inside `window_s` lock that key for
`lockout_s`, doubling with each further lockout of the key up to
`max_lockout_s`. A key quiet for max(window_s, max_lockout_s) is forgotten,
doubling included, which also bounds memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

USER = "user"
ADDRESS = "address"


@dataclass
class _KeyState:
    failures: list[float] = field(default_factory=list)  # times inside the window
    locked_until: float = float("-inf")
    lockouts: int = 0  # lockouts so far, for the doubling
    last: float = float("-inf")  # time of the last failure


class LoginThrottle:
    def __init__(
        self,
        max_failures: int = 5,
        window_s: float = 600,
        lockout_s: float = 60,
        max_lockout_s: float = 3600,
        max_keys: int = 100_000,
    ) -> None:
        if max_failures < 1:
            raise ValueError("max_failures must be at least 1")
        if window_s <= 0 or lockout_s <= 0 or max_lockout_s < lockout_s:
            raise ValueError("need window_s > 0 and 0 < lockout_s <= max_lockout_s")
        self.max_failures = max_failures
        self.window_s = window_s
        self.lockout_s = lockout_s
        self.max_lockout_s = max_lockout_s
        self.max_keys = max_keys
        self._states: dict[tuple[str, str], _KeyState] = {}
        self._last_prune = float("-inf")

    @staticmethod
    def _keys(user: str | None, address: str | None) -> list[tuple[str, str]]:
        # An empty user or unknown address is simply not tracked under that key.
        keys = []
        if user:
            keys.append((USER, user))
        if address:
            keys.append((ADDRESS, address))
        return keys

    def check(self, user: str | None, address: str | None, now: float) -> float:
        """Seconds until `user` may try from `address`; 0 when it may try now."""
        wait = 0.0
        for key in self._keys(user, address):
            state = self._states.get(key)
            if state is not None:
                wait = max(wait, state.locked_until - now)
        return wait

    def failure(self, user: str | None, address: str | None, now: float) -> float:
        """Record a failed attempt; return the lockout it started (0 when none)."""
        self._maybe_prune(now)
        started = 0.0
        for key in self._keys(user, address):
            state = self._states.setdefault(key, _KeyState())
            if now < state.locked_until:
                # Attempts refused while locked are not counted: a user retrying
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
                started = max(started, duration)
        return started

    def success(self, user: str | None, address: str | None, now: float) -> None:
        """A successful login clears the user's key; the address may be shared, so it stays."""
        if user:
            self._states.pop((USER, user), None)

    def _stale(self, state: _KeyState, now: float) -> bool:
        # A lock always ends within max_lockout_s of the failure that started it.
        return now - state.last >= max(self.window_s, self.max_lockout_s)

    def _maybe_prune(self, now: float) -> None:
        # Scanning every key on every failure would be O(n) per login; once per
        # window, or when the table is full, keeps it amortised.
        if len(self._states) < self.max_keys and now - self._last_prune < self.window_s:
            return
        self.prune(now)

    def prune(self, now: float) -> None:
        """Forget stale keys; if still at `max_keys`, drop unlocked keys, oldest first."""
        self._last_prune = now
        self._states = {k: s for k, s in self._states.items() if not self._stale(s, now)}
        if len(self._states) < self.max_keys:
            return
        # Down to 90% so that a full table is not sorted again on every failure.
        excess = len(self._states) - int(self.max_keys * 0.9)
        # Locked keys go last, so that flooding the table with new names or
        # addresses cannot be used to lift a lockout.
        states = self._states
        order = sorted(states, key=lambda k: (now < states[k].locked_until, states[k].last))
        for key in order[:excess]:
            del self._states[key]

    def __len__(self) -> int:
        return len(self._states)
