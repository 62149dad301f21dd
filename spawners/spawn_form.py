"""What the spawn page shows one user: their profiles, availability, queue and balances.

Reads gpulease's context (profiles, assignments, queue, ledger); the page
itself is rendered by `options_form.render_options_form` from the FormData.
"""

from __future__ import annotations

from gpulease.hub.context import GPULeaseContext
from gpulease.hub.my_servers import option_value
from gpulease.hub.profiles import usable_by
from gpulease.spawners.options_form import FormData
from gpulease.spawners.placement import availability


def spawn_form_data(ctx: GPULeaseContext, name: str, groups: set[str], saved: dict) -> FormData:
    """The spawn page of user `name` (in `groups`), preselecting the server's `saved` options."""
    profiles = sorted(
        (p for p in ctx.profiles.list(include_disabled=False) if usable_by(p, groups)),
        key=lambda p: (p.price_per_hour_ucr, p.slug),
    )
    held = set(ctx.assignments.held())
    avail = {
        p.slug: availability(ctx.inventory, held, p.gpu.device_request())
        for p in profiles
        if p.gpu
    }
    group_accounts = [a for a in ctx.ledger.group_accounts() if a.partition(":")[2] in groups]
    balances = ctx.ledger.balances([f"user:{name}", *group_accounts])
    return FormData(
        profiles=profiles,
        availability=avail,
        selected=option_value(saved, "profile") or ctx.profiles.get_default_profile(name),
        selected_image=option_value(saved, "image"),
        waiting=ctx.queue.waiting_by_profile(),
        balance_ucr=int(balances.get(f"user:{name}", 0)),
        images={image.name: image for image in ctx.catalog.images},
        accounts=[(a, int(balances.get(a, 0))) for a in group_accounts],
        selected_account=option_value(saved, "account"),
    )
