"""How often a server may push its state: token buckets per server and per user.

A push is parsed on the gpulease service's one event loop. A tenant's own
server is user code and could push as fast as it can (256 KiB bodies, many
connections, many named servers), slowing the culler's read of everyone's
state: and while that read fails, the culler suspends nobody, so every other
tenant's idle servers would run on. So pushes are rationed before their body
is read:

- per server, a burst of SERVER_BURST, refilled at SERVER_PER_S — gpulease's
  own pusher looks once a second and pushes at most then, so it is never
  refused (singleuser/activity_push.py);
- per user, across all their servers (and any token they mint), a burst of
  USER_BURST refilled at USER_PER_S.

Over the ration a push answers 429 with `Retry-After`; the pusher backs off.
Plain data and a pure rule: the service keeps one `PushRate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SERVER_BURST = 5.0
SERVER_PER_S = 1.0
USER_BURST = 20.0
USER_PER_S = 5.0
MAX_BUCKETS = 400_000  # the oldest are forgotten beyond this (a full bucket is no state)


@dataclass
class Bucket:
    tokens: float
    at: float  # monotonic seconds of the last refill


def refill(bucket: Bucket, now: float, burst: float, per_s: float) -> None:
    bucket.tokens = min(burst, bucket.tokens + max(0.0, now - bucket.at) * per_s)
    bucket.at = now


@dataclass
class PushRate:
    server_burst: float = SERVER_BURST
    server_per_s: float = SERVER_PER_S
    user_burst: float = USER_BURST
    user_per_s: float = USER_PER_S
    _servers: dict[tuple[str, str], Bucket] = field(default_factory=dict)
    _users: dict[str, Bucket] = field(default_factory=dict)

    def wait_s(self, user: str, server: str, now: float) -> int:
        """0 when this push may go ahead (and it is counted); else whole seconds to wait."""
        mine = self._bucket(self._servers, (user, server), now, self.server_burst,
                            self.server_per_s)
        theirs = self._bucket(self._users, user, now, self.user_burst, self.user_per_s)
        if mine.tokens >= 1 and theirs.tokens >= 1:
            mine.tokens -= 1
            theirs.tokens -= 1
            return 0
        short = max((1 - mine.tokens) / self.server_per_s if mine.tokens < 1 else 0.0,
                    (1 - theirs.tokens) / self.user_per_s if theirs.tokens < 1 else 0.0)
        return max(1, math.ceil(short))

    @staticmethod
    def _bucket(buckets: dict, key, now: float, burst: float, per_s: float) -> Bucket:
        bucket = buckets.pop(key, None)
        if bucket is None:
            bucket = Bucket(burst, now)
            while len(buckets) >= MAX_BUCKETS:
                buckets.pop(next(iter(buckets)))
        refill(bucket, now, burst, per_s)
        buckets[key] = bucket  # re-inserted last: the dict stays oldest-first
        return bucket
