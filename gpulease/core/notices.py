"""The words of every notice: its subject and text, by kind.

The hub's notices, the idle culler's and the credit enforcer's all say it in
these words, on the hub's page and in the mail or webhook message alike
(hub/servers/notifier.py sends them).
"""

from __future__ import annotations

import datetime as dt

from gpulease.core.units import format_credits


def _duration(minutes: float | None) -> str:
    if minutes is None:
        return ""
    total = max(0, round(minutes))
    if total < 120:
        return f"{total} min"
    hours, rest = divmod(total, 60)
    return f"{hours} h" + (f" {rest} min" if rest else "")


def _at(deadline: dt.datetime | None) -> str:
    if deadline is None:
        return "soon"
    if deadline.tzinfo is not None:
        deadline = deadline.astimezone(dt.UTC)
    return deadline.strftime("%H:%M UTC")


def _server(server: str) -> str:
    return f"server '{server}'" if server else "default server"


def subject_for(kind: str, user: str, server: str, deadline: dt.datetime | None = None) -> str:
    srv = _server(server)
    subjects = {
        "idle_warning": f"your {srv} will be suspended at {_at(deadline)}",
        "max_runtime_warning": f"your {srv} will be stopped at {_at(deadline)}",
        "preemption_warning": f"your spot {srv} is preempted: suspended at {_at(deadline)}",
        "reservation_ending": f"the reservation of your {srv} ends at {_at(deadline)}",
        "suspended": f"your {srv} was suspended",
        "max_runtime_stopped": f"your {srv} was stopped (maximum runtime)",
        "credit_low": "your credit is running low",
        "queued_started": f"your {srv} has started",
        "right_size": "a smaller profile would have fitted your recent sessions",
    }
    return f"[gpulease] {user}: {subjects.get(kind, kind.replace('_', ' '))}"


def render(kind: str, user: str, server: str, profile: str | None, minutes: float | None,
           deadline: dt.datetime | None) -> tuple[str, str]:
    """(subject, text) of a notice. `minutes` is the duration the kind is about:
    idle so far (idle_warning), the idle timeout (suspended), the maximum
    runtime (max_runtime_*), credit left (credit_low), time queued (queued_started).
    """
    what = f"Your {_server(server)}" + (f" ({profile})" if profile else "")
    dur = _duration(minutes)
    at = _at(deadline)
    kept = "Your files are kept."
    if kind == "idle_warning":
        idle = f"has been idle for {dur}" if dur else "is idle"
        text = f"{what} {idle} and will be suspended at {at} unless you use it. {kept}"
    elif kind == "max_runtime_warning":
        limit = f": its profile allows at most {dur} per run" if dur else ""
        text = (f"{what} will be stopped at {at}{limit}, whether or not it is busy. "
                f"Save your work. {kept}")
    elif kind == "preemption_warning":
        text = (f"{what} runs on the spot tier, and an on-demand start needs its GPU: it "
                f"will be suspended at {at}. Save your work; resume it from the hub's home "
                f"page, on spot again or on demand. {kept}")
    elif kind == "suspended":
        after = f" after {dur} idle" if dur else " because it was idle"
        text = (f"{what} was suspended{after} — resume it from the hub's home page on the "
                f"same or another profile. {kept}")
    elif kind == "max_runtime_stopped":
        after = f" after {dur}, its profile's maximum runtime" if dur else \
            " at its profile's maximum runtime"
        text = f"{what} was stopped{after} — start it again from the hub's home page. {kept}"
    elif kind == "credit_low":
        left = f"about {dur} left" if dur else "little left"
        on = f" on your {_server(server)}" + (f" ({profile})" if profile else "")
        text = (f"Your credit is running low: {left}{on}. When it runs out your servers stop "
                f"(your files are kept); ask an admin for more credit.")
    elif kind == "reservation_ending":
        text = (f"{what} runs on a reservation that ends at {at}; what follows (on demand, "
                f"or suspended) is as its holder chose. {kept}")
    elif kind == "queued_started":
        waited = f" after {dur} in the queue" if dur else ""
        text = f"{what} has started{waited}. Open it from the hub's home page."
    elif kind == "right_size":
        text = (f"A smaller profile would have fitted the recent sessions of your "
                f"{_server(server)}" + (f" ({profile})" if profile else "") +
                ": your usage page says which, and what it would have saved.")
    else:
        raise ValueError(f"unknown notice kind {kind!r}")
    return subject_for(kind, user, server, deadline), text


def render_account_cap(user: str, server: str, profile: str | None, account: str,
                       cap_ucr: int, spent_ucr: int) -> tuple[str, str]:
    """(subject, text) of the `suspended` notice of a stop at a member's monthly cap."""
    what = f"Your {_server(server)}" + (f" ({profile})" if profile else "")
    text = (f"{what} was suspended: you have spent {format_credits(spent_ucr)} credits on "
            f"{account} this month, your monthly cap there of {format_credits(cap_ucr)} "
            f"credits. Ask the group's admin to raise the cap, or resume it on another "
            f"account or a free profile. Your files are kept.")
    return f"[gpulease] {user}: your {_server(server)} was suspended (monthly cap)", text
