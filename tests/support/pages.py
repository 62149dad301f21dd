"""What the tests send to and read of gpulease's pages: a profile form's fields, a page's
navigation bar, the Accept header of a browser's page request and tornado's bare error
page.
"""

from __future__ import annotations

import re


def profile_form(**overrides) -> dict:
    form = {"slug": "h200-slice", "display_name": "H200 slice", "description": "one seventh",
            "gpu_model": "H200", "gpu_mig": "1g.18gb", "gpu_count": "1", "cpu": "4",
            "memory": "32Gi", "images": ["pytorch", "cuda"], "default_image": "cuda",
            "price_per_hour": "1.20", "min_run": "10m", "idle_timeout": "30m",
            "max_runtime": "0", "groups": "vision, nlp", "enabled": "on"}
    form.update(overrides)
    return {k: v for k, v in form.items() if v is not None}


# the navigation bar's items: everyone's, then an auditor's
EVERYONE = ["Servers", "Usage", "Token"]
AUDIT_PAGES = ["Profiles", "Inventory", "Credits", "Limits", "Reservations", "Audit", "Report"]
NAV_LIST = re.compile(r'<ul class="navbar-nav me-auto mb-0">(.*?)</ul>', re.S)
NAV_LINK = re.compile(r'<a class="nav-link" href="([^"]*)">([^<]*)</a>')
BRAND = re.compile(
    r'<a id="jupyterhub-logo" class="navbar-brand[^"]*"\s+href="([^"]*)">([^<]*)</a>')


def bar(html: str) -> dict:
    """What a page's navigation bar shows: its brand and its items (label, target)."""
    found = NAV_LIST.search(html)
    assert found, "no navigation bar"
    brand = BRAND.search(html)
    assert brand, "no brand"
    return {"brand": (brand.group(2).strip(), brand.group(1)),
            "items": [(label.strip(), href) for href, label in NAV_LINK.findall(found.group(1))]}


HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
BARE = re.compile(r"<title>\d{3}: [^<]*</title><body>\d{3}: ")  # tornado's own error page
