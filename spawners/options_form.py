"""The profile chooser on JupyterHub's spawn page (pure HTML rendering).

Every text that comes from an admin or a user is escaped.
"""

from __future__ import annotations

from html import escape

from gpulease.hub.profiles import Profile
from gpulease.hub.units import format_credits


def render_options_form(
    profiles: list[Profile],
    availability: dict[str, tuple[int, int]],
    selected: str | None,
) -> str:
    """One radio card per profile the user may use, with price and what is free."""
    if not profiles:
        return "<p>No profile is available to you. Ask a hub admin for access.</p>"
    if selected not in {p.slug for p in profiles}:
        selected = profiles[0].slug
    cards = []
    for profile in profiles:
        gpu = profile.gpu.describe() if profile.gpu else "CPU only"
        free, total = availability.get(profile.slug, (0, 0))
        avail = f"{free} of {total} free" if profile.gpu else ""
        checked = " checked" if profile.slug == selected else ""
        images = "".join(
            f'<option value="{escape(name)}">{escape(name)}</option>' for name in profile.images
        )
        cards.append(
            f"""
<label class="gpulease-profile"
       style="display:block;border:1px solid #ccc;padding:8px;margin:6px 0">
  <input type="radio" name="profile" value="{escape(profile.slug)}"{checked}>
  <strong>{escape(profile.display_name)}</strong> — {escape(gpu)},
  {escape(str(profile.cpu))} CPU, {escape(_memory(profile.memory_bytes))}
  — {escape(format_credits(profile.price_per_hour_ucr))} credits/h
  <span class="gpulease-availability">{escape(avail)}</span>
  <br><small>{escape(profile.description)}</small>
  <br>Image: <select name="image_{escape(profile.slug)}">{images}</select>
</label>"""
        )
    return "\n".join(cards)


def _memory(n: int) -> str:
    return f"{n / 2**30:g} GiB"


def options_from_form(formdata: dict[str, list[str]]) -> dict[str, str]:
    """Form fields -> user_options: the chosen profile and that profile's image."""
    options: dict[str, str] = {}
    profile = (formdata.get("profile") or [""])[0]
    if profile:
        options["profile"] = profile
        image = (formdata.get(f"image_{profile}") or [""])[0]
        if image:
            options["image"] = image
    return options
