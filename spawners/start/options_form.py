"""The profile chooser on JupyterHub's spawn page (pure HTML rendering).

One card per profile the user may use: its GPU (model, MIG slice, memory),
CPU and memory, image choice, price per hour and per second, what is free
now and how many wait, and how long the user's balance lasts on it. The
spawner gathers the data (`GPULeaseSpawnCore._render_form`); this module only
renders it. Every text that comes from an admin or a user is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from html import escape

from gpulease.core.billing.rules import LOW_BALANCE_MINUTES, minutes_left
from gpulease.core.capacity.cluster_availability import FREE, NEVER, UNKNOWN, Availability
from gpulease.core.model.catalog import Image
from gpulease.core.model.gpu_models import GPU_MEMORY, mig_memory_bytes
from gpulease.core.model.llm_shapes import MODELS
from gpulease.core.model.profiles import Profile
from gpulease.core.policy.options import price_text
from gpulease.core.refusal import Refusal
from gpulease.core.tiers import ON_DEMAND, SPOT, tier
from gpulease.core.units import format_credits, format_duration, rate_cost
from gpulease.spawners.http_error import http_error


@dataclass(frozen=True)
class FormData:
    """What the spawn page shows, gathered by the spawner."""

    profiles: Sequence[Profile]  # those the user may use, in display order
    availability: Mapping[str, Availability] = field(default_factory=dict)  # by profile slug
    selected: str | None = None  # the profile checked at first
    selected_image: str | None = None
    waiting: Mapping[str, int] = field(default_factory=dict)  # queued starts per profile
    balance_ucr: int | None = None  # the user's personal balance; None: unknown
    images: Mapping[str, Image] = field(default_factory=dict)  # catalog entries by name
    accounts: Sequence[tuple[str, int]] = ()  # group accounts the user may charge, balances
    selected_account: str | None = None
    spot: frozenset[str] = frozenset()  # profiles the user may start on the spot tier
    selected_tier: str | None = None
    # By profile slug: the requestable tiers beside on demand the user may start it on
    # (spot's, and any registered one's); a profile left out offers those of `spot`.
    tiers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Where the "Which profile does my work need?" panel asks (the hub's
    # gpulease/recommend, hub/web/recommend.py); "": no panel.
    recommend_url: str = ""


STYLE = """
<style>
  .gpulease-form { display: grid; gap: .6rem; }
  .gpulease-form .gl-card { display: block; border: 1px solid #d9dee7; border-radius: 8px;
    padding: .7rem .9rem; margin: 0; background: #fff; cursor: pointer; }
  .gpulease-form .gl-card:hover { border-color: #9db5e8; }
  .gpulease-form .gl-card:has(input[type=radio]:checked) { border-color: #2f6fde;
    box-shadow: 0 0 0 2px rgba(47,111,222,.25); }
  .gpulease-form .gl-head { display: flex; flex-wrap: wrap; gap: .5rem; align-items: baseline; }
  .gpulease-form .gl-name { font-weight: 700; font-size: 1.05rem; }
  .gpulease-form .gl-price { margin-left: auto; font-variant-numeric: tabular-nums;
    text-align: right; }
  .gpulease-form .gl-price small, .gpulease-form .gl-muted { color: #5b6475; }
  .gpulease-form .gl-specs { display: flex; flex-wrap: wrap; gap: .3rem 1.2rem;
    margin: .35rem 0; font-size: .92rem; }
  .gpulease-form .gl-free { color: #17653a; font-weight: 600; }
  .gpulease-form .gl-none { color: #8a4b00; font-weight: 600; }
  .gpulease-form .gl-low { color: #8a4b00; }
  .gpulease-form .gl-image { display: flex; gap: .5rem; align-items: center; margin-top: .3rem; }
  .gpulease-form .gl-image select { max-width: 100%; }
  .gpulease-form .gl-balance { padding: .5rem .9rem; background: #f6f7fa; border-radius: 8px; }
  .gpulease-form .gl-recommend { border: 1px solid #d9dee7; border-radius: 8px;
    padding: .5rem .9rem; background: #fbfcfe; }
  .gpulease-form .gl-recommend summary { cursor: pointer; font-weight: 600; }
  .gpulease-form .gl-rec-fields { display: flex; flex-wrap: wrap; gap: .4rem 1rem;
    align-items: end; margin: .5rem 0; }
  .gpulease-form .gl-rec-fields label { display: flex; flex-direction: column; font-size: .9rem; }
  .gpulease-form .gl-rec-fields input[type=number] { width: 7rem; }
  .gpulease-form .gl-rec-result table { font-size: .88rem; margin: .4rem 0; }
  .gpulease-form .gl-rec-result td { padding: .1rem .6rem .1rem 0; vertical-align: top; }
  .gpulease-form .gl-rec-result .gl-rec-bytes { text-align: right;
    font-variant-numeric: tabular-nums; white-space: nowrap; }
  .gpulease-form .gl-rec-error { color: #a11; }
</style>"""


def per_second_text(rate_per_hour_ucr: int) -> str:
    """Credits per second, to the µcr (half up): 1.20/h -> "0.000333"."""
    ucr = int((Decimal(rate_per_hour_ucr) / 3600).to_integral_value(ROUND_HALF_UP))
    exact = rate_per_hour_ucr % 3600 == 0
    return ("" if exact else "≈ ") + price_text(ucr)


def minutes_text(minutes: int) -> str:
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def gpu_text(profile: Profile) -> tuple[str, str]:
    """(what GPU, how much GPU memory) of a profile, for its card."""
    gpu = profile.gpu
    if gpu is None:
        return "No GPU (CPU only)", ""
    if gpu.mig:
        return f"{gpu.model}, MIG slice {gpu.mig}", _gib(mig_memory_bytes(gpu.mig))
    per_card = GPU_MEMORY.get(gpu.model)
    memory = ""
    if per_card:
        memory = _gib(per_card) if gpu.count == 1 else f"{gpu.count} × {_gib(per_card)}"
    cards = "1 full card" if gpu.count == 1 else f"{gpu.count} full cards"
    return f"{gpu.model}, {cards}", memory


def _gib(n: int) -> str:
    return f"{n / 2**30:g} GiB"


def _availability(profile: Profile, data: FormData) -> str:
    if profile.gpu is None:
        return '<span class="gl-free">Always available</span>'
    shown = data.availability.get(profile.slug) or Availability(0, 0, UNKNOWN, "not known")
    cls = "gl-free" if shown.state == FREE else "gl-none"
    if shown.state == NEVER:
        text = shown.why  # says it can never run here, and what exists
    elif shown.state == UNKNOWN:
        text = f"Availability unknown: {shown.why}"
    else:
        text = f"{shown.free} of {shown.total} free"
        if shown.state != FREE:
            text += " now: you will wait in the queue"
    waiting = data.waiting.get(profile.slug, 0)
    more = f' · <span class="gl-queue">queue: {waiting} waiting</span>' if waiting > 0 else ""
    return (f'<span class="gpulease-availability {cls}" data-state="{shown.state}">'
            f'{escape(text)}</span>{more}')


def _balance_line(profile: Profile, balance: int | None) -> str:
    if balance is None:
        return ""
    rate = profile.price_per_hour_ucr
    left = minutes_left(balance, rate)
    if left is None:
        return '<span class="gl-minutes">Free: does not use your credit</span>'
    needed = rate_cost(profile.min_run_s, rate)
    if balance < needed:
        return (f'<span class="gl-minutes gl-low">Your balance does not cover its minimum run '
                f'({escape(format_duration(profile.min_run_s))}, '
                f'{escape(price_text(needed))} credits)</span>')
    cls = " gl-low" if left < LOW_BALANCE_MINUTES else ""
    return (f'<span class="gl-minutes{cls}">Your balance buys about '
            f'{escape(minutes_text(left))} on it</span>')


SPOT_WARNING = ("may be interrupted when an on-demand start needs its GPU, after a notice "
                "to save your work; the server is then suspended, your home is kept")


def _tier_choice(profile: Profile, data: FormData, checked: bool) -> str:
    """On demand and each other tier the user may start the profile on (spot), every
    price shown, and what a preemptible tier risks."""
    others = data.tiers.get(profile.slug) or ((SPOT,) if profile.slug in data.spot else ())
    others = tuple(name for name in others if profile.offers(name))
    if not others:
        return ""
    slug = escape(profile.slug)
    chosen = data.selected_tier if checked and data.selected_tier in others else ON_DEMAND

    def option(name: str, shown_as: str) -> str:
        risk = f": {escape(SPOT_WARNING)}" if tier(name).preemptible else ""
        return (f'<option value="{escape(name)}"{" selected" if name == chosen else ""}>'
                f'{escape(shown_as)} — {escape(price_text(profile.price_of(name) or 0))} '
                f'credits/h{risk}</option>')

    return (f'<div class="gl-image gpulease-tier">Tier: <select name="tier_{slug}" '
            f'aria-label="tier for {escape(profile.display_name)}">'
            + "".join(option(name, tier(name).label) for name in (ON_DEMAND, *others))
            + '</select></div>')


def _image_options(profile: Profile, data: FormData, checked: bool) -> str:
    options = []
    offered = profile.images or tuple(data.images)[:1]  # none named: the catalog's first
    chosen = data.selected_image if checked and data.selected_image in offered else None
    for i, name in enumerate(offered):
        image = data.images.get(name)
        label = f"{name} — {image.description}" if image and image.description else name
        sel = " selected" if (name == chosen or (chosen is None and i == 0)) else ""
        options.append(f'<option value="{escape(name)}"{sel}>{escape(label)}</option>')
    return "".join(options)


def _card(profile: Profile, data: FormData, checked: bool) -> str:
    slug = escape(profile.slug)
    gpu, gpu_memory = gpu_text(profile)
    specs = [f"<span>GPU: {escape(gpu)}</span>"]
    if gpu_memory:
        specs.append(f"<span>GPU memory: {escape(gpu_memory)}</span>")
    specs.append(f"<span>CPU: {escape(_cpu(profile))}</span>")
    specs.append(f"<span>Memory: {escape(_gib(profile.memory_bytes))}</span>")
    rate = profile.price_per_hour_ucr
    description = (f'<div class="gl-muted">{escape(profile.description)}</div>'
                   if profile.description else "")
    return f"""
<label class="gl-card gpulease-profile" data-profile="{slug}">
  <div class="gl-head">
    <input type="radio" name="profile" value="{slug}"{" checked" if checked else ""}>
    <span class="gl-name">{escape(profile.display_name)}</span>
    <span class="gl-price"><strong>{escape(price_text(rate))} credits/h</strong><br>
      <small class="gl-per-second">{escape(per_second_text(rate))} credits/s,
        billed by the millisecond</small></span>
  </div>
  {description}
  <div class="gl-specs">{"".join(specs)}</div>
  <div class="gl-specs">{_availability(profile, data)}
    {_balance_line(profile, data.balance_ucr)}</div>
  <div class="gl-image">Image:
    <select name="image_{slug}" aria-label="image for {escape(profile.display_name)}"
      >{_image_options(profile, data, checked)}</select></div>
  {_tier_choice(profile, data, checked)}
</label>"""


def _cpu(profile: Profile) -> str:
    cpu = profile.cpu.normalize()
    text = format(cpu, "f")
    return f"{text} core" + ("" if cpu == 1 else "s")


def _accounts(data: FormData) -> str:
    if not data.accounts:
        return ""
    personal = ('<option value="">your own balance'
                + (f" ({escape(format_credits(data.balance_ucr))} credits)"
                   if data.balance_ucr is not None else "") + "</option>")
    groups = "".join(
        f'<option value="{escape(account)}"'
        f'{" selected" if account == data.selected_account else ""}>'
        f"{escape(account)} ({escape(format_credits(balance))} credits)</option>"
        for account, balance in data.accounts)
    return (f'<label class="gl-image">Charge to: <select name="account">{personal}{groups}'
            "</select></label>")


_TASKS = (("inference", "inference (with a KV cache)"), ("lora", "LoRA fine-tune"),
          ("qlora", "QLoRA fine-tune (4-bit base)"), ("full", "full fine-tune"))
_PRECISIONS = ("bf16", "fp16", "fp32", "int8", "int4")

# The panel's script: reads the fields, asks the hub's gpulease/recommend, and shows the
# answer. Every text from the answer goes in as text (textContent), never as HTML.
RECOMMEND_SCRIPT = """
<script>
(function () {
  var panel = document.querySelector(".gpulease-recommend");
  if (!panel) { return; }
  var out = panel.querySelector(".gl-rec-result");
  function field(name) { return panel.querySelector('[data-field="' + name + '"]'); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function gb(n) { return (n / 1e9).toFixed(2) + " GB"; }
  // One model at a time: typing a parameter count chooses "another model", and choosing a
  // known model clears the count, so what is estimated is always what the fields show.
  field("parameters").addEventListener("input", function () {
    if (field("parameters").value.trim()) { field("model").value = ""; }
  });
  field("model").addEventListener("change", function () {
    if (field("model").value) { field("parameters").value = ""; }
  });
  field("task").addEventListener("change", function () {
    if (field("task").value === "qlora") { field("precision").value = "int4"; }
    else if (field("precision").value === "int4" && field("task").value === "full") {
      field("precision").value = "bf16";
    }
    field("checkpointing").disabled = field("task").value === "inference";
  });
  function query() {
    var q = new URLSearchParams();
    // Both, if both were ever filled, are refused by the hub (never one read for the other).
    var model = field("model").value, parameters = field("parameters").value.trim();
    if (model) { q.set("model", model); }
    if (parameters || !model) { q.set("parameters", parameters); }
    var task = field("task").value;
    q.set("task", task);
    q.set("precision", field("precision").value);
    q.set("batch", field("batch").value);
    q.set("sequence", field("sequence").value);
    if (task !== "inference") { q.set("checkpointing", field("checkpointing").checked); }
    return q.toString();
  }
  function choose(slug) {
    var radio = document.querySelector('input[name="profile"][value="' + CSS.escape(slug) + '"]');
    if (radio) {
      radio.checked = true;
      radio.closest(".gpulease-profile").scrollIntoView({block: "center"});
    }
  }
  function show(a) {
    out.textContent = "";
    out.appendChild(el("p", "gl-rec-total", "Estimated GPU memory for " + a.estimated_for +
      ": " + gb(a.estimate.bytes) + "; a profile must hold " + gb(a.needed_bytes) + " (" +
      a.headroom + "x, for the estimate's error)."));
    if (a.workload.model.assumed) {
      out.appendChild(el("p", "gl-muted", "Shape assumed from the parameter count: " +
        a.workload.model.layers + " layers, width " + a.workload.model.hidden + "."));
    }
    var table = el("table", "gl-rec-parts");
    a.estimate.parts.forEach(function (p) {
      var row = el("tr", "gl-rec-part");
      row.dataset.part = p.name;
      row.appendChild(el("td", "", p.name.replace("_", " ")));
      row.appendChild(el("td", "gl-rec-bytes", gb(p.bytes)));
      row.appendChild(el("td", "gl-muted", p.how));
      table.appendChild(row);
    });
    out.appendChild(table);
    out.appendChild(el("p", "gl-rec-reason", a.reason));
    if (a.recommended) {
      var best = a.profiles.filter(function (p) { return p.slug === a.recommended; })[0];
      var button = el("button", "btn btn-sm btn-primary gl-rec-choose",
        "Choose " + best.display_name);
      button.type = "button";
      button.addEventListener("click", function () { choose(best.slug); });
      out.appendChild(button);
    }
    if (a.profiles.length) {
      var list = el("ul", "gl-rec-fits");
      a.profiles.forEach(function (p) {
        var free = p.availability ? p.availability.free + " of " + p.availability.total +
          " free" : "";
        var item = el("li", "gl-rec-fit", p.display_name + ": " + p.price_per_hour +
          " credits/h" + (free ? ", " + free : "") + (p.split ? " (work split across its " +
          "cards)" : ""));
        item.dataset.profile = p.slug;
        list.appendChild(item);
      });
      out.appendChild(el("p", "", "Profiles that fit, cheapest first:"));
      out.appendChild(list);
    }
  }
  function refused(e) {
    out.textContent = "";
    out.appendChild(el("p", "gl-rec-error", e.message || "The estimate failed."));
  }
  // Enter in a field estimates; it must not submit the spawn form (which starts a server).
  panel.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && e.target.tagName === "INPUT") {
      e.preventDefault();
      panel.querySelector(".gl-rec-go").click();
    }
  });
  panel.querySelector(".gl-rec-go").addEventListener("click", function () {
    out.textContent = "Estimating…";
    fetch(panel.dataset.url + "?" + query(), {credentials: "same-origin",
                                              headers: {"Accept": "application/json"}})
      .then(function (r) { return r.json().then(function (body) {
        if (r.ok) { show(body); } else { refused(body); }
      }); })
      .catch(function (err) { refused({message: String(err)}); });
  });
})();
</script>"""


def _recommend_panel(data: FormData) -> str:
    """The "Which profile does my work need?" panel: a description of the work, and the
    answer of the hub's gpulease/recommend. Its fields have no `name`: the form's Start
    never sends them."""
    if not data.recommend_url:
        return ""
    # "another model" first: nothing is estimated for a model the researcher did not choose
    models = '<option value="" selected>another model (give its parameters)</option>' + "".join(
        f'<option value="{escape(key)}">{escape(shape.name)}</option>'
        for key, shape in MODELS.items())
    tasks = "".join(f'<option value="{value}">{escape(label)}</option>'
                    for value, label in _TASKS)
    precisions = "".join(f'<option value="{p}">{p}</option>' for p in _PRECISIONS)
    return f"""
<details class="gl-recommend gpulease-recommend" data-url="{escape(data.recommend_url)}">
  <summary>Which profile does my work need?</summary>
  <div class="gl-muted">Describe the model and the work: gpulease estimates the GPU memory
    it needs, shows how, and lists the profiles that fit, cheapest first.</div>
  <div class="gl-rec-fields">
    <label>Model <select data-field="model">{models}</select></label>
    <label>Parameters (if another) <input data-field="parameters" placeholder="7B"
      size="8"></label>
    <label>Task <select data-field="task">{tasks}</select></label>
    <label>Precision <select data-field="precision">{precisions}</select></label>
    <label>Batch <input type="number" data-field="batch" value="1" min="1"></label>
    <label>Sequence length <input type="number" data-field="sequence" value="2048"
      min="1"></label>
    <label><span><input type="checkbox" data-field="checkpointing" disabled>
      activation checkpointing</span></label>
    <button type="button" class="btn btn-sm btn-secondary gl-rec-go">Estimate</button>
  </div>
  <div class="gl-rec-result" aria-live="polite"></div>
</details>{RECOMMEND_SCRIPT}"""


def render_options_form(data: FormData) -> str:
    """The spawn page's form: one radio card per profile the user may use."""
    if not data.profiles:
        return "<p>No profile is available to you. Ask a hub admin for access.</p>"
    selected = data.selected
    if selected not in {p.slug for p in data.profiles}:
        selected = data.profiles[0].slug
    balance = ""
    if data.balance_ucr is not None:
        balance = (f'<div class="gl-balance">Your balance: <strong class="gpulease-balance">'
                   f"{escape(format_credits(data.balance_ucr))}</strong> credits. "
                   "Billing is by the millisecond while the server runs; an idle server is "
                   "suspended and stops costing.</div>")
    cards = "".join(_card(p, data, p.slug == selected) for p in data.profiles)
    return (f'{STYLE}\n<div class="gpulease-form">{balance}{_recommend_panel(data)}{cards}'
            f'{_accounts(data)}</div>')


# JupyterHub starts a server from a GET of the spawn page with query arguments
# (/hub/spawn?profile=X). A GET needs no XSRF token: a link on any site, or a
# markdown image in a notebook the user opens, would start their server on a
# profile someone else chose, at their cost. The spawn page shows its form instead.
QUERY_START_REFUSED = ("A server starts from the Start button of this form (or the REST API), "
                       "never by opening a link: anyone can send a link. Nothing was started.")


def refuse_query_start(query: object) -> dict:
    """Spawner.options_from_query: no start from a GET; JupyterHub shows the form with this."""
    raise http_error(Refusal(QUERY_START_REFUSED))


def options_from_form(formdata: dict[str, list[str]]) -> dict[str, str]:
    """Form fields -> user_options: the chosen profile, that profile's image, the account."""
    options: dict[str, str] = {}
    profile = (formdata.get("profile") or [""])[0]
    if profile:
        options["profile"] = profile
        image = (formdata.get(f"image_{profile}") or [""])[0]
        if image:
            options["image"] = image
        tier = (formdata.get(f"tier_{profile}") or [""])[0]
        if tier:
            options["tier"] = tier
    account = (formdata.get("account") or [""])[0]
    if account:
        options["account"] = account
    return options
