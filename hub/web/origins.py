"""Which web origins the hub, the gpulease service and each user's servers get.

A user's server runs their code, and a page it serves runs in the browser of whoever
opens it. On the hub's own origin (`/user/NAME/`) such a page can read the hub's pages
with the visitor's cookies and act as them: an admin who opens a colleague's link gives
away an admin token. So, as JupyterHub recommends for untrusted users, every user's
servers get an origin of their own (JupyterHub.subdomain_host: `USER.<host>`, the
service `gpulease--service.<host>`), on by default:

- on one box listening on loopback, `http://localhost:PORT` (browsers resolve
  `*.localhost` to loopback themselves);
- a hub reachable beyond loopback names its domain (`--subdomain-host
  https://gpu.example.org`, a wildcard DNS record and certificate) or refuses to start,
  unless its admin opts out for a group whose members all trust each other
  (GPULeaseHub.allow_shared_origin);
- with https the hub's cookies carry the `__Host-` prefix, so a user's subdomain cannot
  toss cookies onto the hub (JupyterHub.cookie_host_prefix_enabled).

A plain function over its inputs: what `gpulease up` decides is testable without a hub.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

SHARED_ORIGIN_WARNING = (
    "WARNING: every user's servers share the hub's origin (GPULeaseHub.allow_shared_origin): "
    "a page one user's server serves can act as anyone who opens it. Only for users who "
    "all trust each other.")


PLAIN_HTTP_WARNING = (
    "WARNING: users' servers are on subdomains of a plain-http host: without https the "
    "hub's cookies cannot carry the __Host- prefix, so a user's subdomain can set cookies "
    "for the hub (log a visitor in as herself). Use an https subdomain host.")


class OriginError(ValueError):
    """The origins asked for cannot be served safely; the message says what to set."""


@dataclass(frozen=True)
class OriginPlan:
    subdomain_host: str  # JupyterHub.subdomain_host; "" when servers share the hub's origin
    public_url: str  # JupyterHub.public_url: where browsers reach the hub, with the base URL
    cookie_host_prefix: bool  # JupyterHub.cookie_host_prefix_enabled
    warning: str = ""  # said at start when the plan is weaker than the default


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


DEFAULT_PORTS = {"http": 80, "https": 443}
LOOPBACK_HUB_IPS = ("127.0.0.1", "localhost")  # where http://localhost:PORT reaches the proxy


def origin(scheme: str, host: str, port: int | None) -> str:
    """`scheme://host[:port]`, the port left out when it is the scheme's default, as
    browsers send it in Host (a hub that kept `:80` would redirect to itself forever)."""
    shown = f":{port}" if port and port != DEFAULT_PORTS.get(scheme) else ""
    return f"{scheme}://{host}{shown}"


def check_subdomain_host(url: str) -> str:
    """A subdomain host as JupyterHub needs it (`scheme://name[:port]`), or OriginError."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    host = parts.hostname or ""
    allowed = ("expected https://DOMAIN or http://localhost:PORT, e.g. --subdomain-host "
               "https://gpu.example.org (each user's servers at USER.gpu.example.org: a "
               "wildcard DNS record and certificate for *.gpu.example.org)")
    if parts.scheme not in ("http", "https") or not host:
        raise OriginError(f"subdomain host {url!r}: {allowed}")
    if parts.path.strip("/") or parts.query or parts.fragment or parts.username:
        raise OriginError(f"subdomain host {url!r} has more than a scheme, host and port "
                          f"(the base URL is JupyterHub.base_url): {allowed}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        raise OriginError(f"subdomain host {url!r} is an IP address, which has no subdomains: "
                          f"{allowed}")
    try:
        port = parts.port
    except ValueError:
        raise OriginError(f"subdomain host {url!r}: the port is not a number 1-65535: "
                          f"{allowed}") from None
    return origin(parts.scheme, host.lower().rstrip("."), port)


def plan_origins(*, scheme: str, ip: str, port: int, base_url: str, subdomain_host: str,
                 public_url: str, allow_shared_origin: bool, cluster: bool) -> OriginPlan:
    """The origins `gpulease up` serves. `subdomain_host`/`public_url` as the admin set them
    ("" when not); `ip` is where the hub's proxy listens (ignored by the cluster shape,
    which is always reachable beyond a loopback)."""
    if subdomain_host:
        host = check_subdomain_host(subdomain_host)
        https = host.startswith("https://")
        local = (urlsplit(host).hostname or "") == "localhost"
        return OriginPlan(host, public_url or host + base_url, cookie_host_prefix=https,
                          warning="" if https or local else PLAIN_HTTP_WARNING)
    if allow_shared_origin:
        return OriginPlan("", public_url, cookie_host_prefix=False,
                          warning=SHARED_ORIGIN_WARNING)
    if not cluster and ip in LOOPBACK_HUB_IPS:
        host = origin(scheme, "localhost", port)
        return OriginPlan(host, public_url or host + base_url, cookie_host_prefix=False)
    if not cluster and is_loopback(ip):
        # browsers, and gpulease's own clients, reach *.localhost at 127.0.0.1 (and ::1)
        raise OriginError(
            f"the hub listens on {ip}, where http://USER.localhost:{port}/ (each user's "
            "servers on an origin of their own) does not reach it: use --ip 127.0.0.1, or "
            "name a domain that resolves to it: --subdomain-host http://gpu.test:"
            f"{port} (and GPULeaseHub.allow_shared_origin = True only for users who all "
            "trust each other)")
    where = "the cluster's proxy" if cluster else f"--ip {ip or '0.0.0.0'}"
    raise OriginError(
        f"the hub is reachable beyond this machine ({where}) and would serve every user's "
        "servers on its own origin, where a page one user's server serves can act as "
        "anyone who opens it (an admin included). Name a domain for the users' servers: "
        "--subdomain-host https://gpu.example.org (JupyterHub.subdomain_host; each user's "
        "servers at USER.gpu.example.org: a wildcard DNS record and certificate; "
        "docs/admin.md); or, only for users who all trust each other, set "
        "GPULeaseHub.allow_shared_origin = True.")
