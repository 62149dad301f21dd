"""Which profile, image and account a start request gets (pure).

Resolves the `user_options` of a start: validates every key and value, and
answers refusals with the status and a message that names what is allowed.
An empty request never lands on a GPU by surprise: it gets the user's default
profile, else the cheapest CPU-only profile, else a refusal listing choices.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpulease.core.model.catalog import Catalog, Image
from gpulease.core.model.profiles import FieldError, Profile, tier_usable_by, usable_by
from gpulease.core.refusal import Refusal
from gpulease.core.shown import kind_of, shown
from gpulease.core.tiers import ON_DEMAND, REQUESTABLE, RESERVED, UnknownTier, tier
from gpulease.core.units import format_credits

ALLOWED_KEYS = ("profile", "image", "account", "tier")
TIERS = REQUESTABLE  # reserved is chosen by the hub for a holder's start (the records say)

CHOSEN_BY_REQUEST = "request"
CHOSEN_BY_DEFAULT = "default profile"
CHOSEN_BY_CPU_FALLBACK = "cheapest CPU-only profile"


@dataclass(frozen=True)
class ServerChoice:
    profile: Profile
    image: Image
    account: str
    chosen_by: str
    tier: str = ON_DEMAND
    reservation_id: int | None = None  # tier reserved: the reservation whose unit it takes

    @property
    def rate_per_hour_ucr(self) -> int:
        """What the session is billed per hour: the tier's price of the profile."""
        return rate_for(self.profile, self.tier)


class OptionsRefused(Refusal):
    """A start refused before launch, for its options (400), rights (403) or profile (422)."""

    def __init__(self, status: int, message: str, errors: list[FieldError] | None = None):
        super().__init__(message, errors or (), status=status)


def rate_for(profile: Profile, tier_name: str | None) -> int:
    """The price per hour of `profile` on tier `tier_name`: the profile's price in the
    tier's price field (the on-demand price where it gives none, or the tier is not
    known); nothing for a tier that is not metered (a reserved unit is paid for by its
    reservation)."""
    try:
        record = tier(tier_name or ON_DEMAND)
    except UnknownTier:
        return profile.price_per_hour_ucr
    if not record.metered:
        return 0
    price = profile.price_of(record.name)
    return price if price is not None else profile.price_per_hour_ucr


def _refuse(status: int, field: str, message: str) -> OptionsRefused:
    return OptionsRefused(status, message, [FieldError(field, message)])


def _listing(profiles: list[Profile]) -> str:
    if not profiles:
        return "none: no profile is available to you, ask a hub admin for access"
    return ", ".join(p.slug + ("" if p.is_cpu_only else " (GPU)") for p in profiles)


def _values(options: object) -> dict[str, str]:
    if options is None:  # no body at all: same as {}
        return {}
    if not isinstance(options, dict):
        raise _refuse(400, "user_options",
                      f"user_options must be a JSON object with keys {', '.join(ALLOWED_KEYS)}, "
                      f"got {kind_of(options)}")
    unknown = sorted(str(key) for key in options if key not in ALLOWED_KEYS)
    if unknown:
        raise _refuse(400, unknown[0],
                      f"unknown user_options key(s) {', '.join(unknown)}; "
                      f"allowed: {', '.join(ALLOWED_KEYS)}")
    values: dict[str, str] = {}
    for key, value in options.items():
        # A form submission carries each field as a list of one string.
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, str):
            raise _refuse(400, key, f"user_options {key} must be a string, got {shown(value)}")
        if value:  # a blank form choice means "the default"
            values[key] = value
    return values


def plain_options(options: object) -> dict[str, str]:
    """A start's options as it is resolved: each value a plain string (a list of one, as
    a form sends, is its string), blanks left out. Raises OptionsRefused as a start would."""
    return _values(options)


def _missing_profile(slug: str, deleted: Collection[str], usable: list[Profile]) -> str:
    # An empty-body start reuses saved options: their profile may since have
    # been deleted (DELETE api/profiles/{slug}?force=true). Say so, and that a
    # new choice is needed, rather than a bare "unknown".
    if slug in deleted:
        return (f"profile {slug!r} was deleted by an admin; choose a new profile for this "
                f"server: {_listing(usable)}")
    return (f"profile {slug!r} does not exist (it may have been deleted by an admin); "
            f"choose one of: {_listing(usable)}")


def _choose_profile(
    slug: str | None, user_groups: set[str], profiles: list[Profile], default: str | None,
    deleted: Collection[str] = frozenset(),
) -> tuple[Profile, str]:
    by_slug = {p.slug: p for p in profiles}
    usable = sorted((p for p in profiles if p.enabled and usable_by(p, user_groups)),
                    key=lambda p: (p.price_per_hour_ucr, p.slug))
    if slug is not None:
        profile = by_slug.get(slug)
        if profile is None:
            raise _refuse(400, "profile", _missing_profile(slug, deleted, usable))
        if not profile.enabled:
            raise _refuse(400, "profile",
                          f"profile {slug!r} is disabled; choose one of: {_listing(usable)}")
        if not usable_by(profile, user_groups):
            raise _refuse(403, "profile",
                          f"profile {slug!r} is only for members of group(s) "
                          f"{', '.join(profile.groups)}; profiles you may use: {_listing(usable)}")
        return profile, CHOSEN_BY_REQUEST
    if default is not None and by_slug.get(default) in usable:
        return by_slug[default], CHOSEN_BY_DEFAULT
    cpu_only = [p for p in usable if p.is_cpu_only]
    if cpu_only:
        return cpu_only[0], CHOSEN_BY_CPU_FALLBACK
    if not usable:
        raise _refuse(403, "profile", "No profile is available to you; ask a hub admin for access")
    raise _refuse(400, "profile",
                  "No profile chosen and no CPU-only profile is available to you; "
                  f"choose one of: {_listing(usable)}")


def _choose_image(name: str | None, profile: Profile, catalog: Catalog) -> Image:
    offered = catalog.offered(profile.images)
    present = [n for n in offered if catalog.get(n) is not None]
    if name is not None and name not in offered:
        raise _refuse(400, "image",
                      f"image {name!r} is not offered by profile {profile.slug}; "
                      f"choose one of: {', '.join(present) or '(none)'}")
    chosen = name if name is not None else (present[0] if present else None)
    image = catalog.get(chosen) if chosen is not None else None
    if image is None:
        # The catalog was replaced after the profile was written (or is empty).
        missing = chosen or (offered[0] if offered else "(none)")
        raise _refuse(400, "image",
                      f"image {missing!r} of profile {profile.slug} is not "
                      f"in the image catalog; choose one of: {', '.join(present) or '(none)'}")
    return image


def _choose_account(
    account: str | None, user: str, user_groups: set[str], group_accounts: Collection[str],
) -> str:
    own = f"user:{user}"
    allowed = [own] + sorted(f"group:{g}" for g in set(group_accounts) & set(user_groups))
    choices = f"accounts you may charge: {', '.join(allowed)}"
    if account is None or account == own:
        return own
    kind, _, name = account.partition(":")
    if kind == "user" and name:
        raise _refuse(403, "account", f"account {account!r} is not yours; {choices}")
    if kind == "group" and name:
        if name not in group_accounts:
            raise _refuse(400, "account", f"unknown account {account}; {choices}")
        if name not in user_groups:
            raise _refuse(403, "account", f"you are not a member of group {name}; {choices}")
        return account
    raise _refuse(400, "account",
                  f"account must look like user:NAME or group:NAME, got {account!r}; {choices}")


def withdrawn_after_waiting(profile: Profile | None, slug: str, user_groups: set[str],
                            tier_name: str) -> tuple[str, str] | None:
    """(field, why) a start that waited in the queue may no longer run as asked (the
    profile as it is now: deleted, disabled or restricted meanwhile; for a requested
    tier, its price on the profile and, for spot, the spot groups too), or None."""
    if profile is None or not profile.enabled:
        return "profile", (f"profile {slug} was {'deleted' if profile is None else 'disabled'} "
                           "while the start waited")
    if not usable_by(profile, user_groups):
        return "profile", (f"profile {slug} is restricted to group(s) "
                           f"{', '.join(profile.groups)}, and you are no longer in any of them")
    if tier_name not in REQUESTABLE:
        return None  # the hub's choice (reserved), checked by its own rule
    if not profile.offers(tier_name):
        return "tier", (f"profile {slug} no longer offers {tier_name}; start it on demand, "
                        f"or another profile with a {tier_name} price")
    if not tier_usable_by(profile, tier_name, user_groups):
        return "tier", (f"{tier_name} on profile {slug} is only for members of group(s) "
                        f"{', '.join(profile.spot_groups)}, and you are no longer in any of them")
    return None


def _choose_tier(tier_name: str | None, profile: Profile, user_groups: set[str]) -> str:
    if tier_name is None or tier_name == ON_DEMAND:
        return ON_DEMAND
    if tier_name not in REQUESTABLE:
        raise _refuse(400, "tier", f"unknown tier {tier_name!r}; allowed: "
                                   f"{', '.join(REQUESTABLE)}")
    if not profile.offers(tier_name):
        raise _refuse(400, "tier", f"profile {profile.slug} offers no {tier_name} tier; choose "
                                   f"tier {ON_DEMAND}, or a profile with a {tier_name} price")
    if not tier_usable_by(profile, tier_name, user_groups):
        raise _refuse(403, "tier", f"{tier_name} on profile {profile.slug} is only for members "
                                   f"of group(s) {', '.join(profile.spot_groups)}; choose tier "
                                   f"{ON_DEMAND}")
    return tier_name


def resolve_user_options(
    options: object,
    *,
    user: str,
    user_groups: set[str],
    profiles: list[Profile],
    catalog: Catalog,
    default_profile: str | None,
    group_accounts: Collection[str] = frozenset(),
    deleted_profiles: Collection[str] = frozenset(),
) -> ServerChoice:
    """The profile, image and account of a start, or OptionsRefused(status, message).

    `deleted_profiles` (ProfileStore.deleted_slugs) lets a start whose saved
    profile was deleted say so plainly.
    """
    values = _values(options)
    profile, chosen_by = _choose_profile(
        values.get("profile"), set(user_groups), profiles, default_profile, deleted_profiles
    )
    image = _choose_image(values.get("image"), profile, catalog)
    account = _choose_account(values.get("account"), user, set(user_groups), group_accounts)
    # An empty-body start on the CPU fallback or default profile is on demand: a saved
    # tier belongs to the profile it was chosen with, and is in `values` only then.
    tier = _choose_tier(values.get("tier"), profile, set(user_groups))
    return ServerChoice(profile=profile, image=image, account=account, chosen_by=chosen_by,
                        tier=tier)


def resolved_options(choice: ServerChoice) -> dict[str, str]:
    """The user_options that name what a start resolved, to save on the server.

    An empty-body start resolved by the default profile or the CPU fallback
    saves these, so that the culler, pages, usage and a later resume read the
    same profile, image and account as this start got.
    """
    return {"profile": choice.profile.slug, "image": choice.image.name,
            "account": choice.account, "tier": choice.tier}


def price_text(ucr: int) -> str:
    """Credits with at least 2 decimals and no more than needed: 1_200_000 -> "1.20"."""
    whole, frac = format_credits(ucr).split(".")
    return f"{whole}.{frac.rstrip('0').ljust(2, '0')}"


def why_chosen(choice: ServerChoice) -> str:
    """For a start that named no profile (VS Code's empty body): which rule chose it.

    '' when the request (or the server's saved options) named the profile.
    """
    if choice.chosen_by == CHOSEN_BY_REQUEST:
        return ""
    return f"no profile was chosen, so your {choice.chosen_by} ({choice.profile.slug}) is used"


def options_summary(choice: ServerChoice) -> str:
    """One line for logs and progress.

    'profile h200-1g (H200 slice 1g.18gb, 1.20 credits/h), image pytorch'
    """
    profile = choice.profile
    what = profile.gpu.describe() if profile.gpu is not None else "CPU only"
    spot = f", {choice.tier}: may be interrupted" if tier(choice.tier).preemptible else ""
    if choice.tier == RESERVED:
        spot = f", on reservation {choice.reservation_id}"
    text = (f"profile {profile.slug} ({what}, {price_text(choice.rate_per_hour_ucr)} "
            f"credits/h{spot}), image {choice.image.name}")
    if choice.account.startswith("group:"):
        text += f", account {choice.account}"
    return text
