"""Every gpulease URL from one place: the hub's, the gpulease service's, each server's.

With a subdomain host (on by default, gpulease.hub.web.origins) JupyterHub serves each
user's servers from an origin of their own (`ada.<host>`) and each routed service from
its own (`gpulease--service.<host>`), so a link between the hub's pages, the service's
pages and a server is never a relative path: it is built here, from what JupyterHub
gives (its public URL, its subdomain host, its name encoding), the same way in the
hub, the service, the CLI and the tests. Without a subdomain host everything is under
the hub's origin, as JupyterHub serves it then.

`loopback_session()` is how the project's own clients reach such names: browsers
resolve `*.localhost` to loopback, Python and Node on Debian do not (`hosts: files
dns`), so a request to a `*.localhost` name is sent to 127.0.0.1 with the name kept in
its Host header, which is what the proxy routes by.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import requests
from jupyterhub.utils import subdomain_hook_idna
from requests.adapters import HTTPAdapter

SERVICE_NAME = "gpulease"


def _join(base: str, *parts: str) -> str:
    out = base if base.endswith("/") else base + "/"
    for part in parts:
        out += part.lstrip("/")
    return out


@dataclass(frozen=True)
class SiteURLs:
    """The public URLs of one hub.

    hub_public: the hub's public URL with its base URL (`http://localhost:8000/`,
    JupyterHub.public_url); subdomain_host: JupyterHub.subdomain_host (`http://localhost:
    8000`), "" when every server is under the hub's origin.
    """

    hub_public: str
    subdomain_host: str = ""

    @property
    def base_url(self) -> str:
        return urlsplit(self.hub_public).path or "/"

    def _origin_of(self, name: str, kind: str) -> str:
        """`scheme://<name encoded>.<host>[:port]` (JupyterHub's subdomain_hook) or the hub's."""
        if not self.subdomain_host:
            parts = urlsplit(self.hub_public)  # a path alone: links relative to the origin
            return f"{parts.scheme}://{parts.netloc}" if parts.netloc else ""
        parts = urlsplit(self.subdomain_host)
        domain = subdomain_hook_idna(name, parts.hostname or "", kind)
        return f"{parts.scheme}://{domain}" + (f":{parts.port}" if parts.port else "")

    def hub(self, path: str = "") -> str:
        """A hub page or API path: `hub("home")` -> `http://localhost:8000/hub/home`."""
        return _join(self.hub_public, "hub/", path)

    def service(self, path: str = "", name: str = SERVICE_NAME) -> str:
        """A path of a routed service: `http://gpulease--service.localhost:8000/services/gpulease/…`."""
        return _join(self._origin_of(name, "service"), self.base_url, f"services/{name}/", path)

    def server(self, user: str, server: str = "", path: str = "") -> str:
        """A path of a user's server: `http://ada.localhost:8000/user/ada/[server/]…`."""
        prefix = f"user/{quote(user, safe='@~')}/"
        if server:
            prefix += f"{quote(server, safe='@~')}/"
        return _join(self._origin_of(user, "user"), self.base_url, prefix, path)

    def origins(self) -> dict[str, str]:
        """What the CLI and clients learn of a hub (GET /hub/gpulease/site)."""
        return {"hub": self.hub(), "service": self.service(),
                "subdomain_host": self.subdomain_host}


def is_loopback_name(host: str | None) -> bool:
    """localhost and any name under it (RFC 6761: always loopback)."""
    host = (host or "").rstrip(".").lower()
    return host == "localhost" or host.endswith(".localhost")


class LoopbackNames(HTTPAdapter):
    """Sends a request for `*.localhost` to 127.0.0.1, the name kept in its Host header
    and, with https, in TLS (SNI and the certificate's check are for the name)."""

    def send(self, request, **kwargs):  # type: ignore[override]
        parts = urlsplit(request.url)
        if not is_loopback_name(parts.hostname):
            return super().send(request, **kwargs)
        original_url = request.url
        routed = request.copy()
        routed.headers["Host"] = parts.netloc
        netloc = "127.0.0.1" + (f":{parts.port}" if parts.port else "")
        routed.url = urlunsplit(parts._replace(netloc=netloc))
        response = super().send(routed, **kwargs)
        response.url = original_url  # as the caller asked it (and its cookies' host)
        response.request = request
        return response


    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert)
        name = urlsplit(f"//{request.headers.get('Host', '')}").hostname
        if host_params.get("scheme") == "https" and is_loopback_name(name):
            pool_kwargs["server_hostname"] = name
            if pool_kwargs.get("cert_reqs") == "CERT_REQUIRED":
                pool_kwargs["assert_hostname"] = name
        return host_params, pool_kwargs


def loopback_session(session: requests.Session | None = None) -> requests.Session:
    """A requests session whose `*.localhost` requests reach loopback (see LoopbackNames)."""
    session = session or requests.Session()
    session.mount("http://", LoopbackNames())
    session.mount("https://", LoopbackNames())
    return session
