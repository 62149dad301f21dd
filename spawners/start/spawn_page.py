"""What the spawn page shows one user: their profiles, availability, queue and balances.

Reads gpulease's context (profiles, assignments, queue, ledger); the page
itself is rendered by `options_form.render_options_form` from the FormData.
What is free comes from the spawner (`availability`): the cluster's in the
cluster shape, this host's devices by default; this module stays shape-agnostic.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gpulease.core.capacity.cluster_availability import Availability, host_availability
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.profiles import option_value, spot_usable_by, tier_usable_by, usable_by
from gpulease.core.tiers import ON_DEMAND, REQUESTABLE
from gpulease.spawners.context import GPULeaseContext
from gpulease.spawners.start.options_form import FormData

AvailabilityOf = Callable[[DeviceRequest], Availability]


def spawn_form_data(ctx: GPULeaseContext, name: str, groups: set[str], saved: dict,
                    availability: AvailabilityOf | None = None) -> FormData:
    """The spawn page of user `name` (in `groups`), preselecting the server's `saved` options.

    `availability`: what is free for a GPU request (the spawner's shape decides); None:
    this host's inventory and the devices gpulease holds (the embedded shape)."""
    profiles = sorted(
        (p for p in ctx.profiles.list(include_disabled=False) if usable_by(p, groups)),
        key=lambda p: (p.price_per_hour_ucr, p.slug),
    )
    if availability is None:
        availability = partial(host_availability, ctx.inventory, set(ctx.assignments.held()))
    avail = {p.slug: availability(p.gpu.device_request()) for p in profiles if p.gpu}
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
        spot=frozenset(p.slug for p in profiles if spot_usable_by(p, groups)),
        selected_tier=option_value(saved, "tier"),
        tiers={p.slug: tuple(t for t in REQUESTABLE
                             if t != ON_DEMAND and tier_usable_by(p, t, groups))
               for p in profiles},
    )
