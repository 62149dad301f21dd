"""Right-sizing advice (issue 47, item 3) for the usage page and API, its notice, and the
admins' per-profile report: the thin adapter between the store and the pure rule
(gpulease/core/policy/right_sizing.py).

Blocking functions (they read the database): handlers run them in a thread.

The notice is raised where the advice is computed (the usage page and `GET api/usage`
for one user), not when a session closes: the advice needs the profiles the researcher
may start, and their hub groups are known to the service only when a request asks (the
metering loop that closes sessions has no groups at hand). A session closed since the
last look is counted at the next one; `NoticeStore.post_once` keeps it to one notice per
user and pair of profiles per lookback window, however often the page is opened, and the
researcher is told by mail or webhook as they chose (hub/service/api/billing.py).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpulease.core.model.profiles import Profile, usable_by
from gpulease.core.policy.right_sizing import (
    DEFAULT_THRESHOLDS,
    Advice,
    Offer,
    Thresholds,
    advise,
    offer_from,
    profile_report,
)
from gpulease.core.units import credits_text, format_credits
from gpulease.store.notices import MAX_MESSAGE, Notice, NoticeStore
from gpulease.store.session_uses import ServerUse, recent_uses, uses_by_profile

NOTICE_KIND = "right_size"


@dataclass(frozen=True)
class ProfileAdvice:
    """One advice, with the profile it is about and where its notice is shown."""

    current: str  # the profile the sessions ran on
    server: str  # the server of the latest of them
    advice: Advice


def user_offers(profiles: Iterable[Profile], groups: Iterable[str]) -> list[Offer]:
    """The GPU offers as the researcher sees them: usable where enabled and usable by their
    groups (as the spawn form and api/profiles decide). A profile they may no longer start
    is still an offer, so that their sessions on it are judged, but never suggested."""
    mine = set(groups)
    offers = []
    for p in profiles:
        offer = offer_from(p, usable=p.enabled and usable_by(p, mine))
        if offer is not None:
            offers.append(offer)
    return offers


def user_advice(uses: Sequence[ServerUse], offers: Sequence[Offer],
                t: Thresholds = DEFAULT_THRESHOLDS) -> list[ProfileAdvice]:
    """`advise` for each profile the researcher used, by profile slug."""
    by_slug = {o.slug: o for o in offers}
    last_server: dict[str, str] = {}
    for server, use in uses:  # oldest first: the last one wins
        last_server[use.profile] = server
    found = []
    for slug in sorted(last_server):
        current = by_slug.get(slug)
        if current is None:
            continue  # CPU-only or removed: nothing to right-size
        advice = advise([u for _, u in uses], current, offers, t)
        if advice is not None:
            found.append(ProfileAdvice(slug, last_server[slug], advice))
    return found


def advice_of(engine: Any, profiles: Iterable[Profile], user: str, groups: Iterable[str],
              now: dt.datetime, t: Thresholds = DEFAULT_THRESHOLDS) -> list[ProfileAdvice]:
    """A researcher's advice over their sessions that closed in the lookback window."""
    uses = recent_uses(engine, since=now - t.lookback, user=user)
    if not uses:
        return []
    return user_advice(uses, user_offers(profiles, groups), t)


def advice_view(items: Iterable[ProfileAdvice]) -> list[dict[str, Any]]:
    """The usage API's `advice`: the saving in credits as elsewhere (decimal text)."""
    return [{"profile": a.current, "suggest": a.advice.profile,
             "saved": format_credits(a.advice.saved_ucr), "sessions": a.advice.sessions,
             "hours": round(a.advice.hours, 3), "slower_up_to": a.advice.slower_up_to,
             "speed_known": a.advice.speed_known, "text": a.advice.text}
            for a in items]


def notice_key(current: str, suggest: str) -> str:
    """What the notice's message holds for one advice, which `post_once` looks for: the
    pair, so a later advice for another smaller profile is told too."""
    return f"Right-sizing ({current} → {suggest}): "


def _notice_text(due: dict[str, ProfileAdvice]) -> str:
    """One notice's message for the advice due on a server, within MAX_MESSAGE: each in
    full where all fit, else each in short (the usage page has the rest)."""
    end = " See your usage page."
    full = " ".join(f"{key}{a.advice.text} Choose {a.advice.profile} when you next start "
                    "a server for this work." for key, a in due.items()) + end
    if len(full) <= MAX_MESSAGE:
        return full
    return " ".join(f"{key}{a.advice.profile} would have saved "
                    f"{credits_text(a.advice.saved_ucr)} credits." for key, a in due.items()) + end


# A right-sizing notice still open on a server is left this long before advice due
# since replaces it: a notice is cleared only by dismissing it on the hub's pages, and
# one replaced sooner could go unseen.
NOTICE_SHOWN_FOR = dt.timedelta(days=7)


def raise_notices(store: NoticeStore, user: str, items: Iterable[ProfileAdvice],
                  now: dt.datetime, t: Thresholds = DEFAULT_THRESHOLDS) -> list[Notice]:
    """The `right_size` notices opened for the advice not told in the lookback window:
    one per server, telling every advice due there at once. Where a right-sizing notice
    is open on the server and younger than NOTICE_SHOWN_FOR, the advice waits (it is not
    told, so a later look tells it); so does advice that does not fit one notice even in
    short."""
    since = now - t.lookback
    by_server: dict[str, list[ProfileAdvice]] = {}
    for a in items:
        by_server.setdefault(a.server, []).append(a)
    opened = []
    for server, advice in sorted(by_server.items()):
        keys = {notice_key(a.current, a.advice.profile): a for a in advice}
        told = store.told(user, NOTICE_KIND, list(keys), since)
        due = {key: a for key, a in keys.items() if key not in told}
        while due and len(_notice_text(due)) > MAX_MESSAGE:
            due.pop(next(reversed(due)))
        if not due or any(n.kind == NOTICE_KIND and n.created > now - NOTICE_SHOWN_FOR
                          for n in store.active(user, server)):
            continue
        notice = store.post_once(user, server, NOTICE_KIND, list(due), _notice_text(due),
                                 since)
        if notice is not None:
            opened.append(notice)
    return opened


def report_of(engine: Any, profiles: Iterable[Profile], now: dt.datetime,
              t: Thresholds = DEFAULT_THRESHOLDS) -> list[dict[str, Any]]:
    """The admins' per-profile report over every researcher's sessions that closed in the
    lookback window. Offers as admins see them: enabled, whoever may use them."""
    offers = [o for o in (offer_from(p) for p in profiles) if o is not None]
    rows = profile_report(uses_by_profile(recent_uses(engine, since=now - t.lookback)),
                          offers, t)

    def pct(share: float | None) -> float | None:
        return None if share is None else round(share * 100, 1)

    def one(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return [{"profile": r.profile, "sessions": r.sessions, "hours": round(r.hours, 3),
             "mean_activity": one(r.mean_activity), "p95_activity": one(r.p95_activity),
             "idle_percent": pct(r.idle_share),
             "fits_smaller_percent": pct(r.fits_smaller_share), "advice": r.advice}
            for r in rows]


def report_window(now: dt.datetime, t: Thresholds = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """The window the report covers, for the API and the page to say."""
    return {"since": now - t.lookback, "until": now, "days": t.lookback.days}
